"""specc: a compiler and runtime for speculative-decoding plans."""

__version__ = "0.1.0"
