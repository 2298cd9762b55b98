"""The run pipeline in steps: prepare, sync, job, follow, collect, teardown; attach (exec, logs, cancel)."""
