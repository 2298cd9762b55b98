from types import SimpleNamespace

from cloudtrain.buckets.grants import aws_policy, grants_for, recipe_grants


def test_reads_and_writes_scoped_to_prefixes() -> None:
    grants = grants_for(["./local", "s3://data-bkt/train", "s3://data-bkt/train"], "s3://out-bkt/runs")
    assert [(str(g.url), g.write) for g in grants] == [("s3://data-bkt/train", False), ("s3://out-bkt/runs", True)]
    statements = aws_policy(grants)["Statement"]
    assert statements == [
        {"Effect": "Allow", "Action": ["s3:ListBucket"], "Resource": "arn:aws:s3:::data-bkt",
         "Condition": {"StringLike": {"s3:prefix": ["train", "train/*"]}}},
        {"Effect": "Allow", "Action": ["s3:GetObject"], "Resource": "arn:aws:s3:::data-bkt/train/*"},
        {"Effect": "Allow", "Action": ["s3:ListBucket"], "Resource": "arn:aws:s3:::out-bkt",
         "Condition": {"StringLike": {"s3:prefix": ["runs", "runs/*"]}}},
        {"Effect": "Allow", "Action": ["s3:GetObject", "s3:PutObject", "s3:AbortMultipartUpload"],
         "Resource": "arn:aws:s3:::out-bkt/runs/*"},
    ]


def test_whole_bucket_and_other_stores() -> None:
    grants = grants_for(["s3://whole-bkt", "gs://gcs-bkt/x"], None)
    assert aws_policy(grants)["Statement"] == [
        {"Effect": "Allow", "Action": ["s3:ListBucket"], "Resource": "arn:aws:s3:::whole-bkt"},
        {"Effect": "Allow", "Action": ["s3:GetObject"], "Resource": "arn:aws:s3:::whole-bkt/*"},
    ]


def test_recipe_without_buckets_needs_none() -> None:
    recipe = SimpleNamespace(data=[SimpleNamespace(source="data/")], upload=None)
    assert recipe_grants(recipe) == ()
