"""Whole-file writes: a reader (or a run killed mid-write) sees the old file or the whole new
one, never half of it. Every file electra_jax rewrites in place goes through here."""
import json

from etils import epath


def write_bytes(path, data: bytes):
  target = epath.Path(path)
  tmp = target.with_name(target.name + '.tmp')
  tmp.write_bytes(data)
  tmp.replace(target)


def write_text(path, text: str):
  write_bytes(path, text.encode('utf-8'))


def write_json(path, record, **dump_args):
  """`record` as indented JSON plus a final newline."""
  write_text(path, json.dumps(record, indent=2, **dump_args) + '\n')
