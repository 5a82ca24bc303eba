"""Helpers the test modules share that are no fixture: the manifests users write (`support.manifests`),
where the repository's files are (`support.paths`), servinglab's handler without TorchServe
(`support.handler`), the hack scripts as modules (`support.scripts`), a port held as another process
would hold it (`support.ports`), a server a test starts itself, on other ports when one was taken
(`support.serving`), and waiting for what another process does in its own time (`support.waiting`)."""
