"""Fine-tuning the pretrained discriminator: GLUE, SQuAD and your own files (see loop.py)."""
