"""Server-neutral models: the built-in catalogue and its builds, fetching and checking the user's own
model (bounded, digest-checked), and counting a model (torch only in the modules that run as child
processes: :mod:`.build`, :mod:`.counting`, :mod:`.probe`'s child).

Below the servers (which lay a model out in their own serving form) and above the API.
"""
