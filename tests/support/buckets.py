"""S3 bucket helpers for tests: fresh uniquely named buckets, emptied and removed afterwards.

Works against any S3 endpoint (SeaweedFS here) through boto3 with path-style addressing.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_s3.type_defs import ObjectIdentifierTypeDef


def unique_bucket_name(prefix: str = "t") -> str:
    """A valid, unique bucket name (lowercase letters, digits and '-', 3..63 characters)."""
    return f"{prefix}-{uuid.uuid4().hex[:20]}"


def delete_bucket(client: S3Client, bucket: str) -> None:
    """Delete every object (and unfinished multipart upload) in `bucket`, then the bucket itself."""
    paginator = client.get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=bucket):
        keys: list[ObjectIdentifierTypeDef] = [{"Key": item["Key"]} for item in page.get("Contents", [])]
        if keys:
            client.delete_objects(Bucket=bucket, Delete={"Objects": keys, "Quiet": True})
    for upload in client.list_multipart_uploads(Bucket=bucket).get("Uploads", []):
        client.abort_multipart_upload(Bucket=bucket, Key=upload["Key"], UploadId=upload["UploadId"])
    client.delete_bucket(Bucket=bucket)
