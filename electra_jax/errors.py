"""The one exception type the CLIs turn into a one-line message instead of a traceback."""


class UserError(Exception):
  """Bad input from the user (config, files, workdir): the message names the value and the fix."""


def first_line(error: BaseException, limit: int = 200) -> str:
  """A library error's first non-blank line (else its type's name), cut at `limit`: what a
  one-line message quotes of it."""
  text = next((line.strip() for line in str(error).splitlines() if line.strip()), '')
  text = text or type(error).__name__
  return text if len(text) <= limit else text[:limit] + '...'
