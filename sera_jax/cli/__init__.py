"""The commands, one module each (train, eval, warmstart, export, compare, profile, view): parse, call, print."""
