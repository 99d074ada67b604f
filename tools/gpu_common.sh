# Sourced by the tools/gpu_*.sh scripts (from the repository root): sets PY to the interpreter to use
# ($PYTHON, else the project's .venv, else python3 on PATH), and with `--tiny` among the script's arguments pins
# JAX to the CPU; otherwise prints the GPU it found.
PY="${PYTHON:-}"
if [[ -z "$PY" ]]; then
  if [[ -x .venv/bin/python ]]; then PY=.venv/bin/python; else PY="$(command -v python3 || command -v python)"; fi
fi
if [[ " $* " == *" --tiny "* ]]; then
  export JAX_PLATFORMS=cpu
  GPU_TINY=1
else
  { command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; } || true
  GPU_TINY=0
fi
