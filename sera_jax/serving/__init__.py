"""An OpenAI-compatible endpoint on the engine (``sera-serve``): a run directory's or HF directory's policy behind
``/v1/chat/completions``, ``/v1/completions``, ``/v1/models``, ``/health`` and ``/metrics``."""
