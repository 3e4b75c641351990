"""Writes tests/data/official_checkpoint/: a tiny ELECTRA checkpoint laid out as the official
TF1 code (google-research/electra, run_pretraining.py) saves one, written by TensorFlow's own
Saver, so the tests read the real TF tensor-bundle format without TensorFlow installed.

Variable names are the official code's: the discriminator under `electra/`, the generator's
encoder under `generator/` beside the shared `electra/embeddings`, the heads under
`generator_predictions/` and `discriminator_predictions/` (`dense_1`: the output layer), the
optimizer's `adam_m`/`adam_v` slots and `global_step`. Sizes: E 12, H 16 (2 heads: the official
code's default H // 64 gives 1, so the run set num_attention_heads with
model_hparam_overrides), FFN 4H, 2 layers; generator_hidden_size 0.5 (8 wide, 1 head, FFN 32).

Needs TensorFlow (not a dependency of this project): `pip install tensorflow-cpu`, then
`python tests/data/make_official_checkpoint.py`.
"""
import os

import numpy as np

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'official_checkpoint')
VOCAB = ['[PAD]', '[unused0]', '[UNK]', '[CLS]', '[SEP]', '[MASK]', 'the', 'and', 'to', 'of',
         'a', 'her', 'i', 'was', 'in', 'it', 'not', 'she', 'be', 'that', 'he', 'had', 'you',
         'as', 'for', 'with', 'his', 'but', 'have', 'is', 'at', 'anne', 'emma', '##s', '##ed',
         '##ing', '.', ',', '"', ';']
E, H, FFN, LAYERS, G, G_FFN, POSITIONS, TYPES = 12, 16, 64, 2, 8, 32, 64, 2


def _encoder(scope: str, width: int, ffn: int, inputs: int) -> dict:
  shapes = {}
  if inputs != width:
    shapes.update({f'{scope}/embeddings_project/kernel': (inputs, width),
                   f'{scope}/embeddings_project/bias': (width,)})
  for i in range(LAYERS):
    layer = f'{scope}/encoder/layer_{i}'
    for dense, (n_in, n_out) in {'attention/self/query': (width, width),
                                 'attention/self/key': (width, width),
                                 'attention/self/value': (width, width),
                                 'attention/output/dense': (width, width),
                                 'intermediate/dense': (width, ffn),
                                 'output/dense': (ffn, width)}.items():
      shapes.update({f'{layer}/{dense}/kernel': (n_in, n_out), f'{layer}/{dense}/bias': (n_out,)})
    for norm in ('attention/output/LayerNorm', 'output/LayerNorm'):
      shapes.update({f'{layer}/{norm}/gamma': (width,), f'{layer}/{norm}/beta': (width,)})
  return shapes


def shapes() -> dict:
  """Official variable name -> shape (the model's weights, without optimizer slots)."""
  out = {'electra/embeddings/word_embeddings': (len(VOCAB), E),
         'electra/embeddings/token_type_embeddings': (TYPES, E),
         'electra/embeddings/position_embeddings': (POSITIONS, E),
         'electra/embeddings/LayerNorm/gamma': (E,), 'electra/embeddings/LayerNorm/beta': (E,)}
  out.update(_encoder('electra', H, FFN, E))
  out.update(_encoder('generator', G, G_FFN, E))
  out.update({'generator_predictions/dense/kernel': (G, E),
              'generator_predictions/dense/bias': (E,),
              'generator_predictions/LayerNorm/gamma': (E,),
              'generator_predictions/LayerNorm/beta': (E,),
              'generator_predictions/output_bias': (len(VOCAB),),
              'discriminator_predictions/dense/kernel': (H, H),
              'discriminator_predictions/dense/bias': (H,),
              'discriminator_predictions/dense_1/kernel': (H, 1),
              'discriminator_predictions/dense_1/bias': (1,)})
  return out


def values() -> dict:
  """Every variable the checkpoint holds: weights (LayerNorm scales near 1, the rest about
  +-0.5 so that every part moves the logits), their Adam slots, and global_step. Sines of the
  element index, not random draws: the tests recompute them exactly on any NumPy."""
  out = {}
  for i, (name, shape) in enumerate(shapes().items()):
    wave = lambda scale, phase: (scale * np.sin(np.arange(np.prod(shape)) * 0.7548 + phase)
                                 ).reshape(shape).astype(np.float32)
    out[name] = wave(0.5, i) + (1.0 if name.endswith('/gamma') else 0.0)
    out[f'{name}/adam_m'] = wave(1e-3, i + 0.5)
    out[f'{name}/adam_v'] = np.abs(wave(1e-6, i + 0.25))
  out['global_step'] = np.int64(7)
  return out


def main():
  import shutil  # pylint: disable=import-outside-toplevel
  import tempfile  # pylint: disable=import-outside-toplevel
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  tf.compat.v1.disable_eager_execution()
  arrays = values()
  # Saved elsewhere, then moved here: the `checkpoint` file names the directory the run wrote
  # to (as one copied off a TPU VM or a gs:// bucket does), not this one.
  run_dir = os.path.join(tempfile.mkdtemp(), 'models', 'tiny')
  os.makedirs(run_dir)
  with tf.Graph().as_default():
    variables = [tf.compat.v1.get_variable(name, initializer=tf.constant(value))
                 for name, value in arrays.items()]
    saver = tf.compat.v1.train.Saver(variables)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      saver.save(session, os.path.join(run_dir, 'model.ckpt'), global_step=7,
                 write_meta_graph=False)
  shutil.rmtree(HERE, ignore_errors=True)
  shutil.move(run_dir, HERE)
  with open(os.path.join(HERE, 'vocab.txt'), 'w', encoding='utf-8') as f:
    f.write(''.join(token + '\n' for token in VOCAB))


if __name__ == '__main__':
  main()
