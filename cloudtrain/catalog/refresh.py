"""`cloudtrain catalog refresh`: new prices from gpuhunt's published catalog, written beside the user's state.

Per cloud: fetch (a base URL as gpuhunt publishes it, or a directory of `{provider}.csv` files),
convert (catalog/gpuhunt_format.py), keep the regions asked for, then write
`$CLOUDTRAIN_HOME/catalog/<cloud>.csv` atomically. The bundled CSVs are never written. A cloud whose
download fails, is cut short, is not a readable catalog or has no offers where asked keeps its
current file untouched; the other clouds are still refreshed.

Which regions: `regions` given -> those (each cloud takes the ones its source lists); `all_regions`
-> every region the source lists; neither -> the regions the catalog covers today for that cloud
(so a refresh never widens what `status --refresh` and `gc` search). Rows of other regions already
in the refreshed file stay, so refreshing one region does not drop another refreshed earlier.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cloudtrain.catalog import (
    Catalog,
    Offer,
    read_csv,
    user_catalog_dir,
    write_csv,
)
from cloudtrain.catalog import gpuhunt_format as fmt
from cloudtrain.errors import CloudtrainError, ConfigError, UsageError
from cloudtrain.readlimit import read_at_most

TIMEOUT_S = 60.0
MAX_DOWNLOAD_BYTES = 256 * 1024 * 1024  # far above any published provider catalog (a few MB)
# What the zip may unpack to, and how many members it may have: gpuhunt_format.MAX_CSV_BYTES, MAX_ZIP_MEMBERS.
_SAFE_VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


class RefreshError(CloudtrainError):
    """One cloud's catalog could not be refreshed (its current file is unchanged)."""


@dataclass(frozen=True)
class Source:
    """Where prices come from: a gpuhunt base URL (http, https or file) or a directory of CSVs."""

    location: str
    is_dir: bool

    def describe(self) -> str:
        return f"{'directory' if self.is_dir else 'gpuhunt catalog at'} {self.location}"


@dataclass(frozen=True)
class Fetched:
    cloud: str
    origin: str  # the URL or file read
    version: str | None  # gpuhunt's version, e.g. 20261123-1234 (None for a directory)
    price_date: dt.date
    date_from: str  # "version", "last-modified", "file time" or "download"
    converted: fmt.Converted


@dataclass(frozen=True)
class CloudResult:
    """What a refresh did for one cloud. `error` set: nothing was written for it."""

    cloud: str
    error: str | None = None
    path: Path | None = None
    offers: int = 0
    regions: tuple[str, ...] = ()
    missing_regions: tuple[str, ...] = ()  # asked for (or in the catalog) but not in the source
    kept_offers: int = 0  # rows of other regions kept from the earlier refreshed file
    price_date: dt.date | None = None
    date_from: str = ""
    version: str | None = None
    origin: str = ""
    skipped: Mapping[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.error is None


def refreshable_clouds() -> tuple[str, ...]:
    return tuple(fmt.PROVIDERS)


def resolve_source(explicit: str | None = None, env: Mapping[str, str] | None = None) -> Source:
    """`--source`, else GPUHUNT_CATALOG_DIR, else GPUHUNT_CATALOG_URL, else dstack's published catalog.
    A value with a scheme (http://, https://, file://) is a base URL; anything else is a directory."""
    env = os.environ if env is None else env
    if explicit:
        value, where = explicit, "--source"
    elif env.get(fmt.DIR_ENV):
        value, where = env[fmt.DIR_ENV], fmt.DIR_ENV
    else:
        value, where = env.get(fmt.URL_ENV) or fmt.DEFAULT_URL, fmt.URL_ENV
    if re.match(r"^[a-z][a-z0-9+.-]*://", value, re.IGNORECASE):
        return Source(value.rstrip("/"), is_dir=False)
    path = Path(value).expanduser()
    if where == fmt.URL_ENV or not path.is_dir():
        raise UsageError(f"{where} {value!r}: not a directory or a URL",
                         hint="give a gpuhunt base URL (https://..., file://...) or a directory of gpuhunt CSVs "
                         "named after the provider (e.g. gcp.csv)")
    return Source(str(path), is_dir=True)


def fetch(source: Source, cloud: str, today: dt.date | None = None) -> Fetched:
    """One cloud's catalog from the source, converted. Raises RefreshError."""
    provider = fmt.PROVIDERS[cloud]
    today = today or dt.date.today()
    if source.is_dir:
        path = Path(source.location) / f"{provider}.csv"
        try:
            with path.open("rb") as handle:
                raw = read_at_most(handle, fmt.MAX_CSV_BYTES)
            if len(raw) > fmt.MAX_CSV_BYTES:
                raise RefreshError(f"{cloud}: {path}: larger than {fmt.MAX_CSV_BYTES // (1024 * 1024)} MiB, refused")
            text = raw.decode("utf-8")
            mtime = dt.datetime.fromtimestamp(path.stat().st_mtime, dt.UTC).date()
        except FileNotFoundError:
            raise RefreshError(f"{cloud}: no {provider}.csv in {source.location}") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise RefreshError(f"{cloud}: cannot read {path}: {exc}") from None
        return Fetched(cloud, str(path), None, mtime, "file time", _convert(cloud, text, mtime, str(path)))
    base = f"{source.location}/{provider}"
    raw_version, _ = _get(f"{base}/version", 4096, cloud)
    version = raw_version.decode("utf-8", "replace").strip()
    if not _SAFE_VERSION.match(version) or ".." in version:
        raise RefreshError(f"{cloud}: {base}/version does not hold a catalog version (got {version[:40]!r})")
    url = f"{base}/{version}/catalog.zip"
    data, last_modified = _get(url, MAX_DOWNLOAD_BYTES, cloud)
    try:
        text = fmt.csv_from_zip(data, provider)
    except fmt.FormatError as exc:
        raise RefreshError(f"{cloud}: {url}: {exc}") from None
    price_date, date_from = fmt.version_date(version), "version"
    if price_date is None and last_modified is not None:
        price_date, date_from = last_modified, "last-modified"
    if price_date is None:
        price_date, date_from = today, "download"
    return Fetched(cloud, url, version, price_date, date_from, _convert(cloud, text, price_date, url))


def _convert(cloud: str, text: str, price_date: dt.date, origin: str) -> fmt.Converted:
    try:
        converted = fmt.convert(cloud, text, price_date)
    except fmt.FormatError as exc:
        raise RefreshError(f"{cloud}: {origin}: {exc}") from None
    if not converted.offers:
        why = ", ".join(f"{n} {reason}" for reason, n in sorted(converted.skipped.items())) or "it is empty"
        raise RefreshError(f"{cloud}: {origin}: no usable offers in {converted.rows} rows ({why})")
    return converted


def _get(url: str, limit: int, cloud: str) -> tuple[bytes, dt.date | None]:
    """GET `url`: its whole body (checked against Content-Length) and its Last-Modified date."""
    import email.utils
    import http.client
    import urllib.error
    import urllib.request

    from cloudtrain import __version__

    request = urllib.request.Request(url, headers={"User-Agent": f"cloudtrain/{__version__}"})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            expected = response.headers.get("Content-Length")
            data = read_at_most(response, limit)
            modified = response.headers.get("Last-Modified")
    except urllib.error.HTTPError as exc:
        raise RefreshError(f"{cloud}: {url}: HTTP {exc.code} {exc.reason}") from None
    except urllib.error.URLError as exc:
        raise RefreshError(f"{cloud}: {url}: {exc.reason}") from None
    except (http.client.HTTPException, OSError, ValueError) as exc:
        raise RefreshError(f"{cloud}: {url}: download failed: {type(exc).__name__}: {exc}") from None
    if len(data) > limit:
        raise RefreshError(f"{cloud}: {url}: larger than {limit // (1024 * 1024)} MiB, refused")
    if expected is not None and expected.isdigit() and len(data) != int(expected):
        raise RefreshError(f"{cloud}: {url}: download cut short ({len(data)} of {expected} bytes)")
    date = None
    if modified:
        try:
            date = email.utils.parsedate_to_datetime(modified).date()
        except (TypeError, ValueError):
            date = None
    return data, date


def refresh(
    clouds: Sequence[str],
    *,
    source: Source,
    regions: Sequence[str] = (),
    all_regions: bool = False,
    catalog: Catalog | None = None,
    out_dir: Path | None = None,
    today: dt.date | None = None,
) -> list[CloudResult]:
    """Refresh each cloud; a cloud that fails gets a result with `error` and keeps its file.

    Raises UsageError (nothing written) when a region asked for is listed by no source that was read
    and every cloud was read."""
    catalog = catalog or Catalog()
    out_dir = out_dir or user_catalog_dir()
    today = today or dt.date.today()
    fetched: dict[str, Fetched] = {}
    results: dict[str, CloudResult] = {}
    for cloud in clouds:
        try:
            fetched[cloud] = fetch(source, cloud, today)
        except RefreshError as exc:
            results[cloud] = CloudResult(cloud, error=exc.message)
    source_regions = {c: {o.region for o in f.converted.offers} for c, f in fetched.items()}
    wanted = list(dict.fromkeys(regions))
    if wanted:
        everywhere = set().union(*source_regions.values()) if source_regions else set()
        unknown = [r for r in wanted if r not in everywhere]
        if unknown and len(fetched) < len(clouds):
            for cloud, result in results.items():
                results[cloud] = dataclasses.replace(
                    result, error=f"{result.error} (so --region {', '.join(unknown)} could not be looked for there)")
        elif unknown:
            from cloudtrain.yamlfile import did_you_mean

            names = ", ".join(repr(r) for r in unknown)
            raise UsageError(
                f"--region {names}: not a region of {', '.join(clouds)} in the source",
                hint=did_you_mean(unknown[0], sorted(everywhere)) or f"the source lists {len(everywhere)} regions; "
                "--all-regions takes every one",
            )
    for cloud, got in fetched.items():
        if wanted:
            chosen = [r for r in wanted if r in source_regions[cloud]]
            if not chosen:
                continue  # none of the regions asked for belongs to this cloud
            missing: list[str] = []
        elif all_regions:
            chosen, missing = sorted(source_regions[cloud]), []
        else:
            current = catalog.regions(cloud)
            chosen = [r for r in current if r in source_regions[cloud]] if current else sorted(source_regions[cloud])
            missing = [r for r in current if r not in source_regions[cloud]]
        if not chosen:
            results[cloud] = CloudResult(cloud, error=f"{cloud}: the source has no offers in {', '.join(missing)}",
                                         origin=got.origin, missing_regions=tuple(missing))
            continue
        results[cloud] = _write(cloud, got, chosen, missing, out_dir)
    return [results[c] for c in clouds if c in results]


def _write(cloud: str, got: Fetched, chosen: Sequence[str], missing: Sequence[str], out_dir: Path) -> CloudResult:
    keep_regions = set(chosen)
    # Each refreshed price names where it was published (the catalog zip, or the directory's file).
    new = [dataclasses.replace(o, price_source=got.origin) for o in got.converted.offers if o.region in keep_regions]
    path = out_dir / f"{cloud}.csv"
    kept: list[Offer] = []
    if path.exists():
        try:
            kept = [o for o in read_csv(path) if o.cloud == cloud and o.region not in keep_regions]
        except ConfigError:
            kept = []  # our own file, unreadable (edited by hand): replaced whole
    try:
        write_csv(path, [*kept, *new])
    except OSError as exc:
        return CloudResult(cloud, error=f"{cloud}: cannot write {path}: {exc}", origin=got.origin)
    return CloudResult(
        cloud, path=path, offers=len(new), regions=tuple(sorted(keep_regions)), missing_regions=tuple(missing),
        kept_offers=len(kept), price_date=got.price_date, date_from=got.date_from, version=got.version,
        origin=got.origin, skipped=got.converted.skipped,
    )
