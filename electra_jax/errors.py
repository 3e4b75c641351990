"""The one exception type the CLIs turn into a one-line message instead of a traceback."""


class UserError(Exception):
  """Bad input from the user (config, files, workdir): the message names the value and the fix."""
