"""Constrained decoding: regexes, JSON schemas and choice lists compiled with outlines-core into
token-level automata; per-request grammar states, vectorised masks and jump-forward."""
