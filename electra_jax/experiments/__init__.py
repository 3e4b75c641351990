"""Experiments built on the train and finetune commands (compare: runs matched on compute)."""
