"""``sera-serve``: a run's policy (or a Hugging Face directory's) behind an OpenAI-compatible endpoint."""

from __future__ import annotations

import argparse
import sys

from sera_jax.cli.common import use_compilation_cache


def main(argv: list[str] | None = None) -> int:
    """``sera-serve RUN_DIR | --hf HF_DIR [--host H] [--port P] [engine and limit flags]``: serves until
    interrupted; returns the exit status (2 when the policy cannot be loaded)."""
    p = argparse.ArgumentParser(prog="sera-serve", description=(
        "Serve a trained policy behind an OpenAI-compatible API (/v1/chat/completions with the Qwen chat template, "
        "/v1/completions, /v1/models, /health, /metrics) on the rollout engine: concurrent requests share its "
        "continuous batch and prefix cache."))
    p.add_argument("run_dir", nargs="?", default=None, help="run directory (or its checkpoints/)")
    p.add_argument("--hf", default=None, help="Hugging Face directory instead of a run")
    p.add_argument("--version", type=int, default=None, help="checkpoint version (default: latest)")
    p.add_argument("--tokenizer", default=None, help="tokenizer path or builtin:NAME (default: found from the run)")
    p.add_argument("--served-model-name", default=None, help="model name clients send (default: the directory's)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="0 picks a free port (printed at start)")
    p.add_argument("--max-batch", type=int, default=32, help="engine rows decoding at once")
    p.add_argument("--max-context", type=int, default=None, help="prompt + completion tokens per request "
                   "(default: the model's positions, at most 4096)")
    p.add_argument("--num-blocks", type=int, default=None, help="KV blocks of 16 tokens (default: every row's "
                   "whole context within 35%% of device memory)")
    p.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                   help="sampler dtype (default: float32 on CPU, bfloat16 on GPU)")
    p.add_argument("--max-tokens", type=int, default=None, help="largest max_tokens a request may ask for")
    p.add_argument("--max-n", type=int, default=8, help="largest n (choices per prompt)")
    p.add_argument("--max-top-logprobs", type=int, default=5,
                   help="largest top_logprobs a request may ask for; the engine computes that many most likely "
                        "tokens beside each generated one (0: none; OpenAI allows 20)")
    p.add_argument("--max-body-bytes", type=int, default=4 << 20)
    p.add_argument("--request-timeout", type=float, default=600.0, help="seconds before a request is cancelled")
    p.add_argument("--graceful-timeout", type=float, default=30.0,
                   help="seconds a shutdown waits for the requests in flight")
    p.add_argument("--warmup", action="store_true", help="compile every engine shape before serving")
    p.add_argument("--log-level", default="info")
    args = p.parse_args(argv)
    if (args.run_dir is None) == (args.hf is None):
        p.error("give a RUN_DIR or --hf HF_DIR (exactly one)")

    from sera_jax.serving.policy import load_served_policy
    from sera_jax.serving.server import ServeOptions, serve

    use_compilation_cache()
    try:
        policy = load_served_policy(args.run_dir, hf_dir=args.hf, version=args.version, tokenizer=args.tokenizer,
                                    name=args.served_model_name)
    except (FileNotFoundError, ValueError) as e:
        print(f"sera-serve: {e}", file=sys.stderr)
        return 2
    opts = ServeOptions(max_batch=args.max_batch, max_context=args.max_context, num_blocks=args.num_blocks,
                        dtype=args.dtype, max_tokens=args.max_tokens, max_n=args.max_n,
                        max_body_bytes=args.max_body_bytes, deadline_s=args.request_timeout, warmup=args.warmup,
                        max_top_logprobs=args.max_top_logprobs)
    print(f"sera-serve: {policy.name} from {policy.source}, tokenizer {policy.tokenizer_path}", flush=True)
    serve(policy, opts, args.host, args.port, log_level=args.log_level, graceful_s=args.graceful_timeout,
          on_listen=lambda url: print(f"sera-serve: listening on {url}", flush=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
