"""Datasets, results and checkpoints in object storage (S3, GCS, Azure Blob): docs/data.md.

- `url.py`: bucket URLs (`s3://bucket/prefix`, `gs://bucket/prefix`, `az://account/container/prefix`),
  parsed and checked when the recipe loads, before anything exists.
- `grants.py`: what the node's own identity must be allowed to do (read the data buckets, write
  the upload prefix), the one description every provider turns into its cloud's policy.
- `steps.py`: the run's bucket steps on the nodes (copy in before the job, upload at its end), as
  detached jobs running templates/bucket_copy.py with the node's own credentials.

No cloud SDK is imported here: the copy runs on the node (obstore), the policies in providers/.
"""
