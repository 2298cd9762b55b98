import pytest

from cloudtrain.buckets.url import BucketUrl, Store, parse_bucket_url

pytestmark = pytest.mark.quick


@pytest.mark.parametrize("text, expected", [
    ("s3://my-data/imagenet/train", BucketUrl(Store.S3, "my-data", "imagenet/train")),
    ("s3://my.data.bucket", BucketUrl(Store.S3, "my.data.bucket", "")),
    ("s3://my-data/a//b/", BucketUrl(Store.S3, "my-data", "a/b")),
    ("gs://my_data-1/x", BucketUrl(Store.GCS, "my_data-1", "x")),
    ("az://acct01/my-container/p/q", BucketUrl(Store.AZURE, "my-container", "p/q", "acct01")),
])
def test_parses(text: str, expected: BucketUrl) -> None:
    assert parse_bucket_url(text) == expected


@pytest.mark.parametrize("text, says", [
    ("ftp://bucket/x", "unknown store 'ftp'"),
    ("s3://", "no bucket name"),
    ("s3://My_Bucket/x", "bucket names are 3-63"),
    ("s3://ab", "bucket names are 3-63"),
    ("s3://a..b/x", "bucket names"),
    ("s3://bucket/../etc", "'..' are not allowed"),
    ("s3://bucket/a b", "no spaces"),
    ("az://acct01", "name the storage account and the container"),
    ("az://Acct/cont", "storage account names"),
    ("az://acct01/co--nt", "container names"),
])
def test_refuses_in_one_line(text: str, says: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_bucket_url(text)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_round_trip_and_child() -> None:
    url = parse_bucket_url("az://acct01/cont/a")
    assert str(url) == "az://acct01/cont/a" and url.bucket_url == "az://acct01/cont"
    assert str(url.child("run-1/")) == "az://acct01/cont/a/run-1"
    assert str(parse_bucket_url("s3://bkt").child("r")) == "s3://bkt/r"
