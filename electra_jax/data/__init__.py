"""Text sources, tokenizers and the input pipeline."""
