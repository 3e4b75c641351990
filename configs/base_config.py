"""Every config key with its default: the single source of truth.

Experiment files (small.py, base.py, large.py, demo.py) import this and change a few keys.
Size keys left as None are filled from the `model_size` preset (electra_jax/config.py), so
`--config.model_size=base` switches the whole architecture while any single key can still be
overridden, e.g. `--config.num_layers=6`.
"""
from ml_collections import config_dict

placeholder = config_dict.placeholder


def get_config():
  c = config_dict.ConfigDict()

  # --- Model -------------------------------------------------------------------------------
  # Architecture preset: 'demo', 'small', 'base' or 'large' (the paper's table).
  c.model_size = 'small'
  # Token embedding width E (None: from model_size). If E != hidden width, a linear E->H
  # projection follows the shared embeddings.
  c.embedding_size = placeholder(int)
  # Discriminator hidden width H (None: from model_size).
  c.hidden_size = placeholder(int)
  # Transformer layers, for both generator and discriminator (None: from model_size).
  c.num_layers = placeholder(int)
  # Attention heads of the discriminator (None: from model_size).
  c.num_heads = placeholder(int)
  # Feed-forward inner width of the discriminator (None: from model_size).
  c.intermediate_size = placeholder(int)
  # Generator width as a fraction of the discriminator's (hidden, FFN and heads all scale).
  c.generator_hidden_size = 0.25
  # Generator depth as a fraction of the discriminator's layers (official generator_layers;
  # round(num_layers * fraction), at least 1).
  c.generator_layers = 1.0
  # Learned absolute position embeddings (BERT: 512); max_seq_length must not exceed it.
  c.max_position_embeddings = 512
  # Token-type (segment) vocabulary size.
  c.type_vocab_size = 2
  # Dropout on embeddings, attention output and FFN output.
  c.dropout_rate = 0.1
  # Dropout on attention probabilities.
  c.attention_dropout_rate = 0.1
  # Initial bias of the discriminator's output logit (paper/official code: 0). The prior logit
  # of 'replaced', log(r / (1 - r)) for a replaced fraction r (about -1.8 at 15 % masking),
  # keeps a small, fast-warming-up discriminator from collapsing its hidden states.
  c.disc_output_bias_init = 0.0
  # Std of the truncated-normal init of every kernel and embedding table (BERT's
  # initializer_range, 0.02). At the demo's width 128 a larger one (0.08) did not help its
  # discriminator (held-out AUC 0.51-0.54 over 2,000 steps; benchmarks/RESULTS.md, issue 19):
  # relative_attention_span did.
  c.initializer_range = 0.02
  # Glorot-uniform init for embeddings_project and the discriminator's dense_prediction, as the
  # official release has (tf.layers.dense's default there); False: initializer_range for them too.
  c.glorot_projections = False
  # Not the paper's architecture: a learned per-head bias on attention scores for each
  # key-query offset, clipped to +-N (T5/Shaw-style relative positions, on top of the absolute
  # ones), starting as ALiBi's local window. 0 = off (BERT/ELECTRA). transformers' ELECTRA has
  # no such bias: export refuses it.
  c.relative_attention_span = 0
  # Compute dtype: 'float32' or 'bfloat16' (parameters and optimizer state stay float32).
  c.dtype = 'float32'
  # Rematerialisation of each transformer layer in the backward pass, trading compute for
  # activation memory (e.g. Large at seq 512 on one GPU): 'none' | 'save_dots' | 'full'.
  c.remat = 'none'
  # Who computes attention where one fused call does it (attention dropout 0, or evaluation):
  # 'auto' takes cuDNN's flash attention on an NVIDIA GPU (Ampere or later) in bfloat16 when it
  # computes what XLA would (padding last in each row, no relative_attention_span), XLA's
  # otherwise; 'xla' always XLA's. The same values up to rounding (benchmarks/RESULTS.md).
  c.attention_implementation = 'auto'

  # --- Data --------------------------------------------------------------------------------
  # Vocabulary: a sentencepiece model (*.model, [PAD] [UNK] [CLS] [SEP] [MASK] at ids 0..4) or
  # a BERT/ELECTRA WordPiece vocab.txt (*.txt, uncased: lower-cased, accents stripped).
  c.vocab_file = 'data/demo_spm.model'
  # Vocabulary size; must equal the size of vocab_file.
  c.vocab_size = 8000
  # WordPiece vocab.txt only: lower-case and strip accents (uncased BERT/ELECTRA); False for a
  # cased vocabulary. init_from a transformers directory takes it from its tokenizer config.
  c.do_lower_case = True
  # Glob (comma-separated globs allowed) of UTF-8 training text: one sentence or paragraph per
  # line, documents separated by blank lines (.gz or .zst too); or record files, JSON Lines
  # (.jsonl/.ndjson/.json, .gz or .zst too), Parquet (.parquet) or Arrow (.arrow), one document
  # per record in its text_key field.
  c.train_files = 'data/demo_corpus/train/*.txt'
  # TFDS text dataset to pretrain on instead of train_files (eval reads eval_files, or
  # tfds_eval_split below), e.g. 'wikipedia/20230601.en', prepared as ArrayRecord
  # (`tfds build NAME --file_format=array_record`); '' = off.
  c.tfds_name = ''
  # TFDS split to read (slices such as 'train[:90%]' work).
  c.tfds_split = 'train'
  # With tfds_name: the TFDS split evaluation reads instead of eval_files, e.g. c4's
  # 'validation', or 'train[99%:]' beside tfds_split='train[:99%]' ('' = eval_files).
  c.tfds_eval_split = ''
  # The field holding a record's text in JSON Lines, Parquet and Arrow files and TFDS datasets;
  # each record is one document, one paragraph per line.
  c.text_key = 'text'
  # Record files (not TFDS) only: each record's text is a line of one running text, a blank
  # record ending a document, as in a text file (the Hub's wikitext: a line per record).
  c.records_are_lines = False
  # TFDS data directory ('' = TFDS's default, ~/tensorflow_datasets).
  c.tfds_data_dir = ''
  # Directory written by `python -m electra_jax.data.prepare` (tokenized, packed ArrayRecord
  # shards); when set, training reads it instead of train_files / tfds_name ('' = off).
  c.train_data_dir = ''
  # Skip (and count in the log) lines of train/eval files that are not UTF-8 (JSON Lines: not
  # objects; record files: records without text under text_key), instead of failing.
  c.skip_bad_lines = False
  # Worker processes reading training batches (0 = a thread in the training process).
  c.num_data_workers = 0
  # Glob of held-out text in the same format, for periodic evaluation and evaluate.py.
  c.eval_files = 'data/demo_corpus/eval/*.txt'
  # Tokens per example including [CLS] and [SEP]s.
  c.max_seq_length = 128
  # Probability that an example targets a random length in [5, max_seq_length] instead of
  # max_seq_length (official release: 0.05).
  c.short_seq_prob = 0.05
  # Let examples run on from one document into the next (False: the paper's packing, an example
  # ends with its document). For corpora of short documents (reviews, posts, a paragraph
  # each), whose examples are otherwise mostly padding; transformers' run_mlm packs this way.
  c.pack_across_documents = False

  # --- Masking and objective ---------------------------------------------------------------
  # Fraction of real tokens chosen for prediction (paper: 0.15; 0.25 for Large).
  c.mask_prob = 0.15
  # Upper bound on masked positions per sequence (None: int((mask_prob + 0.005) * seq), which
  # a resume at another max_seq_length follows without listing it in allow_config_change).
  c.max_predictions_per_seq = placeholder(int)
  # Of the chosen positions: fraction replaced by [MASK] (official code 0.85; BERT 0.8).
  c.mask_token_prob = 0.85
  # Of the chosen positions: fraction replaced by a random token (official 0.0; BERT 0.1).
  # The rest keep the original token.
  c.random_token_prob = 0.0
  # Draw the chosen positions with replacement (a position may be drawn twice and count twice
  # in the MLM loss), as the official release does; False: a distinct subset.
  c.mask_with_replacement = False
  # Choose whole words rather than tokens (BERT's whole-word masking): words in random order,
  # each taken whole if it still fits in the sequence's mask_prob budget. A word is a token
  # and the ones continuing it (WordPiece `##...`; sentencepiece pieces without the word-start
  # mark); punctuation is a word of its own. A sequence whose words left are all too long for
  # the rest of its budget holds fewer predictions (metric masked_fraction).
  c.whole_word_masking = False
  # Weight of the generator's MLM loss.
  c.gen_weight = 1.0
  # Weight of the discriminator's replaced-token-detection loss (paper: 50).
  c.disc_weight = 50.0
  # The generator's learning rate as a multiple of learning_rate (its own parameters; shared
  # embeddings keep learning_rate). Below 1 slows the generator so the discriminator keeps up.
  c.generator_lr_multiplier = 1.0
  # Softmax temperature of the generator when sampling replacements.
  c.temperature = 1.0
  # Never sample the original token (official disallow_correct): every masked position is
  # replaced.
  c.disallow_correct = False
  # Replace masked tokens by uniformly random ones instead of a generator's samples (official
  # uniform_generator): no generator network; its MLM loss is the constant log(vocab_size).
  c.uniform_generator = False
  # Pretraining objective (paper's ablations, README "Ablations"): 'electra' (RTD), 'mlm'
  # (BERT: one full-size MLM, no generator), 'electra_15' (RTD loss on masked positions only),
  # 'replace_mlm' (MLM on generator-replaced positions), 'all_tokens_mlm' (predict every token
  # with a copy mechanism), 'two_stage' (generator alone, then a frozen one feeds RTD),
  # 'adversarial' (the generator maximises the discriminator's loss by REINFORCE), 'electric'.
  c.objective = 'electra'
  # Weights shared by generator and discriminator: 'embeddings' (token/position/type tables),
  # 'none' (each has its own), 'all' (also every encoder weight; needs generator_hidden_size 1)
  # or 'gdes' (DeBERTa-v3: each embedding array D reads is stop_gradient(G's) + its own
  # zero-initialised delta, so RTD never moves G's embeddings; electra / electra_15 only).
  c.tie = 'embeddings'
  # objective='two_stage': steps training the generator alone before the discriminator is
  # initialised from it (then trained with the generator frozen for the remaining steps).
  c.two_stage_generator_steps = 0

  # --- Optimisation ------------------------------------------------------------------------
  # Global batch size in sequences (split over all devices of all hosts).
  c.train_batch_size = 128
  # Total optimizer steps.
  c.num_train_steps = 1_000_000
  # Linear warmup steps from 0 to learning_rate, then decay to 0 at num_train_steps.
  # More than num_train_steps (a short smoke run of a long recipe) warms up over the whole run.
  c.num_warmup_steps = 10_000
  # Power of the decay: lr * (1 - step / num_train_steps) ** power (official: 1.0, linear).
  c.lr_decay_power = 1.0
  # The official release's schedule shape: lr * decay(step) * min(1, step / warmup), the decay
  # running during warmup too; False: warm up to the full learning_rate, then decay.
  c.warmup_times_decay = False
  # Peak learning rate.
  c.learning_rate = 5e-4
  # Decoupled weight decay (AdamW); not applied to LayerNorm parameters or biases (applied to
  # the embeddings and the relative attention table, tables by token and by position).
  c.weight_decay_rate = 0.01
  # Adam first-moment decay.
  c.adam_b1 = 0.9
  # Adam second-moment decay.
  c.adam_b2 = 0.999
  # Adam epsilon (official release: 1e-6).
  c.adam_epsilon = 1e-6
  # Adam's bias correction of its moments (optax); the official release has none (larger
  # steps over the first ~1,000).
  c.adam_bias_correction = True
  # Clip gradients to this global norm (0 disables).
  c.max_grad_norm = 1.0
  # Split each global batch into this many micro-batches whose gradients are summed before one
  # optimizer step (same result as the whole batch; trades time for memory). 1 = off.
  c.grad_accum_steps = 1
  # Seed for initialisation, data order, masking, sampling and dropout.
  c.seed = 0

  # --- Initialisation (README: "Continue pretraining google/electra-base on your corpus") ---
  # A new run (step 0, fresh optimizer, schedule and data order) starts from these weights: a
  # transformers ELECTRA discriminator directory, an electra_jax workdir (latest checkpoint),
  # one of its checkpoints (WORKDIR/checkpoints/STEP), or an official (TF1) checkpoint (its
  # prefix or directory). Shape keys and the vocabulary come from it. Ignored when the workdir
  # already holds checkpoints (the run resumes). '' = random init.
  c.init_from = ''
  # With a transformers init_from: its generator directory (ElectraForMaskedLM); '' = a random
  # generator of generator_hidden_size. A workdir's generator comes with init_from.
  c.init_generator_from = ''
  # With init_from: a text file of new vocabulary tokens, one per line, appended to the source's
  # vocabulary; each new embedding row starts as the mean of the rows of the pieces the old
  # tokenizer split the token into. '' = keep the vocabulary.
  c.extend_vocab_file = ''

  # --- Parallelism -------------------------------------------------------------------------
  # Devices per group sharing one copy of parameters and optimizer state (FSDP): the mesh is
  # (devices / fsdp_axis_size) x fsdp_axis_size over ('data', 'fsdp'). 1 = pure data parallel.
  c.fsdp_axis_size = 1

  # --- Loop, evaluation and checkpoints ----------------------------------------------------
  # Train steps per call of the compiled program (a lax.scan; Keras' steps_per_execution, the
  # official code's iterations_per_loop): the host dispatches, and on a GPU updates the step's
  # CUDA graph, once per call instead of once per step. The same weights and metrics as 1.
  # Logging, evaluation, checkpoints and stops happen between calls: a call also ends at each
  # multiple of log_every_steps, eval_every_steps, save_checkpoints_steps and at
  # num_train_steps, so intervals that are not multiples of it give shorter calls too (each
  # other length compiles once more; the run prints a note).
  c.steps_per_execution = 1
  # Write metrics (metrics.jsonl, TensorBoard, progress line) every N steps.
  c.log_every_steps = 100
  # Evaluate on eval_files (or tfds_eval_split) every N steps (0 disables periodic evaluation).
  c.eval_every_steps = 5000
  # Global batch size for evaluation.
  c.eval_batch_size = 128
  # Batches per periodic evaluation (0: the whole eval set).
  c.num_eval_steps = 20
  # Save a checkpoint every N steps (and always at the end).
  c.save_checkpoints_steps = 10_000
  # Keep this many most recent checkpoints.
  c.keep_checkpoint_max = 3
  # Show a tqdm progress bar on stderr (process 0 only).
  c.progress_bar = True

  # --- Resilience (README: "What happens when a run dies") ---------------------------------
  # Stop with an error after this many consecutive steps with a non-finite loss or gradients
  # (each such step's update is skipped and counted in `skipped_steps`); 0 never stops.
  c.max_consecutive_nonfinite = 10
  # Comma-separated config keys allowed to differ from the workdir's saved config on resume,
  # e.g. 'learning_rate,num_train_steps' (parameter-shape keys can never change).
  c.allow_config_change = ''

  return c
