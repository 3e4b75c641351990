"""Fine-tuning config: every key with its default (GLUE; squad.py and files.py change a few).

  python -m electra_jax.finetune --config=configs/finetune/glue.py --config.task=sst2 \
      --config.init_checkpoint=WORKDIR --workdir=FT_DIR [--config.num_seeds=10]

Keys left as None take the paper's value for the task or model size (electra_jax/finetune/
settings.py); an unknown --config.KEY is an error naming it.
"""
from ml_collections import config_dict

placeholder = config_dict.placeholder


def get_config():
  c = config_dict.ConfigDict()

  # --- Task and data -----------------------------------------------------------------------
  # Task name: a GLUE task (cola sst2 mrpc qqp stsb mnli qnli rte wnli), squad_v1, squad_v2,
  # 'files' (your own train_file / eval_file) or 'tagging' (your own CoNLL-format files).
  c.task = 'sst2'
  # TFDS data directory for GLUE/SQuAD (None: TFDS's default, ~/tensorflow_datasets).
  c.tfds_data_dir = placeholder(str)
  # Let TFDS download and prepare (as ArrayRecord) a GLUE/SQuAD dataset that is not there yet.
  c.tfds_download = True
  # task=files: training CSV/TSV with a header row, JSON Lines (.gz, .zst too), Parquet (the
  # Hugging Face Hub's datasets) or Arrow (datasets' save_to_disk), with columns text or
  # text_a/text_b, and label (or as named below); a GLUE task: its own copy read instead of TFDS
  # (the Hub's files, GLUE's TSVs), its columns found by their GLUE names; SQuAD: the official
  # JSON files (train-v2.0.json, dev-v2.0.json) instead of TFDS;
  # task=tagging: a CoNLL-format file (a word and its tag per line, sentences blank-separated),
  # or JSON Lines/Parquet/Arrow records of a words list (tokens) and a tags list (label_column).
  c.train_file = placeholder(str)
  # task=files / tagging / a GLUE or SQuAD task with train_file: evaluation file in the same
  # format.
  c.eval_file = placeholder(str)
  # Files of classification/regression tasks: the column of the text, or two comma-separated for
  # pairs (e.g. 'review' or 'question,answer'); '' = a GLUE task's own names (sentence1,
  # sentence2, ...) where the file has them, else text, or text_a and text_b. Tagging records:
  # the words column ('' = tokens).
  c.text_columns = ''
  # Files of classification/regression tasks: the column of the label (task=files: its values
  # become the classes, or floats: regression). Tagging records: the tags column (e.g.
  # ner_tags).
  c.label_column = 'label'
  # task=files: 'auto' (float labels such as 0.5 -> regression, else classes), 'class' or
  # 'regression'.
  c.label_type = 'auto'
  # Files of classification/regression tasks: skip (and count in the log) rows that cannot be
  # read as examples, CSV/TSV rows of more fields than the header or rows without a label or
  # text value (BERT's and transformers' GLUE readers skip such rows), instead of failing.
  # Tagging files: skip sentences with a line of another column count than the file's first,
  # and records without a list of words and one tag per word.
  c.skip_bad_rows = False
  # Use at most this many training examples (0: all); for quick runs.
  c.max_train_examples = 0
  # Use at most this many evaluation examples (0: all).
  c.max_eval_examples = 0
  # Tokens per example including [CLS] and [SEP]s (SQuAD: the window length).
  c.max_seq_length = 128

  # --- Initialisation ----------------------------------------------------------------------
  # A pretraining workdir (its config.json and latest checkpoint) or a transformers ELECTRA
  # directory. The generator is dropped; embeddings + discriminator are fine-tuned.
  c.init_checkpoint = placeholder(str)
  # The pretraining workdir's checkpoint step to start from (None: its latest), e.g. to fine-tune
  # a run's earlier checkpoints.
  c.init_step = placeholder(int)
  # Fine-tune the same architecture from random weights (the baseline pretraining must beat).
  c.random_init = False
  # Architecture when there is no init_checkpoint (random_init): 'demo', 'small', 'base', 'large'.
  c.model_size = 'small'
  # Sentencepiece vocabulary (None: the pretraining config's vocab_file; else the demo vocab).
  c.vocab_file = placeholder(str)
  # Dropout on embeddings, attention and FFN outputs, and before the task head.
  c.dropout_rate = 0.1
  # Dropout on attention probabilities.
  c.attention_dropout_rate = 0.1
  # What the classification head reads: 'cls' (the [CLS] state, as the paper) or 'mean' (the
  # mean of every real token's state). Not used by SQuAD's span head.
  c.classifier_pooling = 'cls'
  # Task-head kernels: 'normal' (BERT's truncated normal, std 0.02) or 'glorot'
  # (Glorot-uniform: tf.layers.dense's default, what the official release's heads start from).
  c.head_init = 'normal'

  # --- Optimisation (paper: ELECTRA.md, fine-tuning) ----------------------------------------
  # Peak learning rate (None: 3e-4 small, 1e-4 base, 5e-5 large, 1e-3 demo).
  c.learning_rate = placeholder(float)
  # Layer-wise LR decay: top layer lr*d, layer i lr*d^(L-i), embeddings lr*d^(L+1)
  # (None: 0.8 small/base/demo, 0.9 large; 1.0 disables).
  c.layerwise_lr_decay = placeholder(float)
  # The official release's exponents, one higher: top layer d^2, embeddings d^(L+2) (a known
  # bug there, but the paper's GLUE numbers were made with it).
  c.official_layerwise_decay = False
  # Passes over the training set (None: the task's default: 10 RTE/STS-B, 2 SQuAD, 3 others).
  c.num_epochs = placeholder(int)
  # Global training batch size in examples.
  c.train_batch_size = 32
  # Run each batch as this many micro-batches whose gradients add up to the batch's (rows i,
  # i+k, ...; each row's dropout as in the whole batch): the same training in less memory.
  c.grad_accum_steps = 1
  # Rematerialisation of each encoder layer in the backward pass ('none', 'save_dots', 'full':
  # less activation memory for more compute, e.g. Large on SQuAD's 512-token windows); '' = the
  # pretraining config's ('none' for a transformers directory).
  c.remat = ''
  # Global evaluation batch size.
  c.eval_batch_size = 128
  # Fraction of the training steps spent in linear warmup; then linear decay to 0.
  c.warmup_fraction = 0.1
  # Power of the decay: lr * (1 - step / steps) ** power (official: 1.0, linear).
  c.lr_decay_power = 1.0
  # The official schedule shape: the decay runs during warmup (lr * decay * min(1, t / warmup)).
  c.warmup_times_decay = False
  # 'mean' of the per-example losses over the batch, or 'sum' as the official release (its
  # gradients are then batch-size times larger, and clipping at max_grad_norm bites harder).
  c.loss_reduction = 'mean'
  # MRPC and STS-B: train on each pair in both sentence orders, as the official release does.
  c.double_unordered = False
  # Decoupled weight decay (AdamW), not on LayerNorm or biases (paper 0; official code 0.01).
  c.weight_decay_rate = 0.01
  # Adam first-moment decay.
  c.adam_b1 = 0.9
  # Adam second-moment decay.
  c.adam_b2 = 0.999
  # Adam epsilon.
  c.adam_epsilon = 1e-6
  # Adam's bias correction of its moments (optax); the official release has none.
  c.adam_bias_correction = True
  # Clip gradients to this global norm (0 disables).
  c.max_grad_norm = 1.0

  # --- SQuAD (doc_stride: tagging too) ------------------------------------------------------
  # Tokens between the starts of consecutive windows over a SQuAD context, or over a tagged
  # sentence longer than max_seq_length (None: 128 for SQuAD, as the official code; half the
  # window for tagging, so every word has context on both sides in some window).
  c.doc_stride = placeholder(int)
  # Question tokens kept.
  c.max_query_length = 64
  # Longest answer span considered, in tokens.
  c.max_answer_length = 30
  # Top-k starts, and top-k ends for each, searched at inference.
  c.beam_size = 20
  # Weight of the answerability loss (SQuAD 2.0; paper: 0.5; the 'bert' head has none).
  c.answerable_weight = 0.5
  # The span head: 'xlnet' (hidden_size-wide tanh layers, a LayerNorm before the end logit,
  # answerability per window, SQuAD 2.0 only, no answer below probability 0.5), 'official'
  # (the official release's: 512-wide GELU layers, answerability per question on every window,
  # trained for SQuAD 1.1 too, no answer where its logit is below 2.75) or 'bert' (one linear
  # layer, start and end independent, decoded as BERT's run_squad: no answer where the lowest
  # [CLS] score over a question's windows beats its best span; transformers'
  # ElectraForQuestionAnswering, the one python -m electra_jax.export writes).
  c.span_head = 'xlnet'

  # --- Tagging ------------------------------------------------------------------------------
  # Span tags as learned: 'file' (as the data has them: IOB1, IOB2 or BIOES) or 'bioes' (the
  # same chunks re-encoded B/I/E/S, as the official tagging code trains; predictions then come
  # out in BIOES). Chunk metrics are the same in either.
  c.tag_encoding = 'file'
  # The tagging head: 'transformers' (dropout + one linear layer on each word's first piece,
  # segment id 0: transformers' ElectraForTokenClassification, the one export writes) or
  # 'official' (the official tagging code's: the linear layer alone, every token fed segment 1).
  c.tag_head = 'transformers'

  # --- Runs and outputs ---------------------------------------------------------------------
  # Independent runs with seeds seed .. seed+num_seeds-1 (the paper reports the median of 10).
  c.num_seeds = 1
  # First seed (head initialisation, data order, dropout).
  c.seed = 0
  # Keep each seed's best epoch (by the task's main metric) as an Orbax checkpoint.
  c.save_best_checkpoint = True
  # Also save the unfinished seed's train state every this many steps (0: only at each epoch's
  # end and on SIGTERM / Ctrl-C); the same command resumes a killed run from the newest save.
  c.save_checkpoints_steps = 0
  # Show a tqdm progress bar on stderr.
  c.progress_bar = True
  # Compute dtype: 'float32' or 'bfloat16'.
  c.dtype = 'float32'
  return c
