"""The load generator: Locust users driving TorchServe, with servinglab's own latency recording.

* :mod:`.payloads` makes request bodies of the model's input size (no files needed);
* :mod:`.stats` turns raw samples into exact percentiles and windowed throughput (pure);
* :mod:`.closed_loop` runs closed-loop concurrency levels with Locust in this process.

Importing :mod:`.closed_loop` imports Locust, which monkey-patches the process with gevent; callers
(the `run` and `loadtest` commands) import it before anything that opens sockets.
"""
