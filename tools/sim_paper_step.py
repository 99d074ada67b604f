"""The paper's TextCraft SERA step at full scale on simulated GPUs: can the host keep them busy? (issue #57)

    python tools/sim_paper_step.py                          # 8 groups × 8 trees, 8 simulated H200s, one process
    python tools/sim_paper_step.py --stage rubric_generation  # the counterfactual stage: 8 branches per fork
    python tools/sim_paper_step.py --processes 2            # 2 processes × 8 simulated GPUs, 4 groups each
    python tools/sim_paper_step.py --tiny                   # the tiny config, 2 groups × 2 trees (CPU test)

configs/paper/textcraft_sera.yaml with the engines on a simulated device (``engine.backend: simulated``): the
policy's tokens are the TextCraft oracle's, its device programs take the roofline's time on the GPU, and the host
path (runtime, env workers, sandboxes, rubric and score calls, scheduler, credit, packing) is real and measured
(``sera_jax/profiling/host_side.py``). The Qwen tokenizer is not shipped: prompts are tokenised with the run's
tokenizer (``--tokenizer``, default the builtin TextCraft one), which counts other tokens than Qwen's.
With ``--processes N`` each process runs every N-th task group on its own 8 simulated GPUs, env workers and
sandboxes, as one host of an N-host job does (the processes share no state: the rollouts' host side is per host).

Every figure printed is labelled simulated. Prints a JSON report and ``RESULT simulated=GPU ...``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sera_jax.assembly.tasks import load_env_tasks  # noqa: E402
from sera_jax.assembly.tokenizer import resolve_tokenizer  # noqa: E402
from sera_jax.cli.simulate import install_for  # noqa: E402
from sera_jax.config import load_config  # noqa: E402
from sera_jax.model import Qwen3Config  # noqa: E402
from sera_jax.profiling.host_side import result_line, simulated_step  # noqa: E402
from sera_jax.profiling.machine import matmul_rate  # noqa: E402


def run_config(args: argparse.Namespace):
    """Returns the step's RunConfig: the paper's (or the tiny one) on the simulated GPU."""
    sim = ["engine.backend=simulated", f"engine.simulate={args.gpu}"]
    if args.tiny:
        return load_config([str(ROOT / "configs/tiny_cpu.yaml")],
                           sim + ["model.init_from=null", "rollout.tasks_per_step=2", "rollout.trees_per_task=2",
                                  "engine.simulated_gpus=2", "env.num_workers=1", "env.difficulties=[easy]"])
    return load_config([str(ROOT / "configs/paper/textcraft_sera.yaml")],
                       sim + ["model.hf_dir=null", f"model.tokenizer={args.tokenizer}",
                              f"env.num_workers={args.workers}"] + args.overrides)


def one_process(args: argparse.Namespace) -> dict:
    cfg = run_config(args)
    install_for(cfg)
    tokenizer = resolve_tokenizer(cfg.model.tokenizer, None)[0]
    tasks, _ = load_env_tasks(cfg)
    tasks = tasks[:cfg.rollout.tasks_per_step]
    ranks = None if args.ranks == 1 else [i for i in range(len(tasks)) if i % args.ranks == args.rank]
    rep = asyncio.run(simulated_step(cfg, tasks, tokenizer, stage=args.stage, ranks=ranks))
    return {**rep.figures, "process": args.rank, "processes": args.ranks}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tiny", action="store_true", help="the tiny config: 2 groups × 2 trees on 2 simulated GPUs")
    p.add_argument("--gpu", default="h200", help="the simulated GPU (h200, h100)")
    p.add_argument("--stage", default="execution", choices=("execution", "delegation", "rubric_generation"))
    p.add_argument("--processes", type=int, default=1, help="processes (hosts), each with its simulated GPUs")
    p.add_argument("--tokenizer", default="builtin:textcraft")
    p.add_argument("--workers", type=int, default=16, help="env worker processes per process (paper: 16)")
    p.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--ranks", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--json", default=None, help="write the report here")
    p.add_argument("overrides", nargs="*", help="a.b=c config overrides")
    args = p.parse_args(argv)
    try:
        run_config(args)
        if args.processes > 1:
            with tempfile.TemporaryDirectory() as d:
                procs = [subprocess.Popen([sys.executable, __file__, *([] if not args.tiny else ["--tiny"]),
                                           "--gpu", args.gpu, "--stage", args.stage, "--tokenizer", args.tokenizer,
                                           "--workers", str(args.workers), "--rank", str(r),
                                           "--ranks", str(args.processes), "--json", f"{d}/p{r}.json",
                                           *args.overrides], env=os.environ) for r in range(args.processes)]
                if any(pr.wait() for pr in procs):
                    print("sim_paper_step: a process failed", file=sys.stderr)
                    return 1
                parts = [json.loads(Path(f"{d}/p{r}.json").read_text()) for r in range(args.processes)]
        else:
            parts = [one_process(args)]
    except ValueError as e:  # a config error or an unknown GPU: one line
        print(f"sim_paper_step: error: {e}", file=sys.stderr)
        return 2
    if args.ranks > 1:  # a child process: its share only
        Path(args.json).write_text(json.dumps(parts[0]))
        return 0
    rate = matmul_rate(Qwen3Config.preset("tiny"))
    out = {"simulated": args.gpu, "matmul_gflops": rate / 1e9, "processes": parts}
    text = json.dumps(out, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text)
    print(result_line(parts, matmul_gflops=round(rate / 1e9, 1)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
