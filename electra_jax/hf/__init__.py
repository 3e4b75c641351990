"""HF transformers ELECTRA directories: weight names, ElectraConfig, tokenizer files, reading
and writing. Export (export.py), init_from (init_from.py) and fine-tuning build on these."""
