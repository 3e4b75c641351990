"""electra_jax: ELECTRA replaced-token-detection pretraining in JAX/Flax."""

__version__ = '0.1.0'
