"""The program that runs on every node: the watchdog (autostop, budget, lease, liveness mark,
interruption notices, the node's own notifications), one module per idea. Standard library only,
Python 3.8+, importing nothing of the rest of cloudtrain: the laptop ships this package as one
zipapp (bundle.py) and imports protocol.py and jobs.py itself, so both sides read one definition.

  protocol  file names, job states, config fields, the rules both sides share
  files     small JSON files, the decision log, the loop's lock
  jobs      job state and process identity, as runner.sh's files say
  signals   ssh sessions and GPUs: activity besides jobs
  actions   the stop or delete, the liveness mark, the expiry tags
  notices   the clouds' interruption notices
  tell      the node's own webhook events, signed
  settings  what the config enforces, the lease's clocks
  loop      the loop (`run`)
  install   ensure / stop, reboot hooks
  bundle    the zipapp, built on the laptop
"""
