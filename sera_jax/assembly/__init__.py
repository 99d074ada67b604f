"""A run's parts from a config, shared by training, evaluation and the warm start.

Pure functions of a ``RunConfig`` (and, for memory budgets, the local devices): the env tasks a run draws from, the
agent runtime settings per stage, how many task groups run at once, the engines' sizes and KV budget, the judge's
settings, and the tokenizer a config names. This room imports none of ``training/``, ``evaluation/`` or
``warmstart/``; they all import it.
"""
