"""The load generator: closed-loop users (Locust) and open-loop schedules driving any server kind,
with servinglab's own per-request recording.

* :mod:`.levels` runs an experiment's load section: closed-loop levels, open-loop rates, the peak-rate
  search (:mod:`.peak`) and shaped schedules (:mod:`.shapes`, :mod:`.arrivals`);
* :mod:`.closed_loop` and :mod:`.open_loop` measure one level; :mod:`.protocol` and :mod:`.payloads` make and
  read the requests each server kind wants;
* :mod:`.stats` turns raw samples into exact percentiles and windowed throughput (pure);
* :mod:`.generators`, :mod:`.sharing`, :mod:`.meeting`, :mod:`.messages`, :mod:`.wire` let several load pods
  drive one level and merge it as if one had measured it.

Importing :mod:`.closed_loop` imports Locust, which monkey-patches the process with gevent; callers
(the `run` and `loadtest` commands) import it before anything that opens sockets.
"""
