"""The model alone, without a server: the child process that measures it and the parent that runs it."""
