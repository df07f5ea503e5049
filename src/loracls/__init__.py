"""loracls: small decoder-only LMs + LoRA -> verified text classifiers."""

__version__ = "0.1.0"
__all__ = ["__version__"]
