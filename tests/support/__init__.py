"""Helpers the test modules share that are no fixture: the manifests users write (`support.manifests`) and
where the repository's files are (`support.paths`)."""
