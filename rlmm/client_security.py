"""Kafka client security settings: the Java client settings a broker passes its plugin, as librdkafka's.

A broker hands the metadata manager its listener's settings in Java's names (`sasl.jaas.config`,
`ssl.truststore.location`, ...); confluent-kafka speaks librdkafka's. librdkafka names pass through.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from rlmm.errors import ConfigError

_OWNER = "RemoteLogMetadataManager"
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
# Java login modules whose username/password librdkafka takes as sasl.username / sasl.password.
_LOGIN_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}
_JAAS = re.compile(r"^\s*(?P<module>[\w.$]+)\s+(?P<flag>required|requisite|sufficient|optional)(?P<options>.*?);?\s*$",
                   re.DOTALL)
_JAAS_OPTION = re.compile(r'(?P<key>[\w.]+)\s*=\s*(?:"(?P<quoted>(?:[^"\\]|\\.)*)"|(?P<bare>[^\s;]+))')
# Java-only settings with no librdkafka counterpart that matters to a client of one cluster: accepted so a
# broker's listener settings can be passed as they are, and left out.
_JAVA_ONLY_IGNORED = frozenset({
    "ssl.protocol", "ssl.enabled.protocols", "ssl.keymanager.algorithm", "ssl.trustmanager.algorithm",
    "ssl.secure.random.implementation", "sasl.login.refresh.window.factor", "sasl.login.refresh.window.jitter",
    "sasl.login.refresh.min.period.seconds", "sasl.login.refresh.buffer.seconds",
})


def _key(name: str) -> str:
    return f"kafka.{name}"


def librdkafka_settings(client: Mapping[str, Any]) -> dict[str, Any]:
    """`client` (the manager's `kafka.*` settings, prefix removed) with Java security settings translated.

    Unsupported combinations fail here, naming the key and what to use instead.
    """
    settings = {k: v for k, v in client.items() if k not in _JAVA_ONLY_IGNORED}
    _translate_sasl(settings)
    _translate_truststore(settings)
    _translate_keystore(settings)
    algorithm = settings.get("ssl.endpoint.identification.algorithm")
    if algorithm is not None and str(algorithm).strip() == "":
        settings["ssl.endpoint.identification.algorithm"] = "none"  # Java's "" turns host checking off
    return settings


def _translate_sasl(settings: dict[str, Any]) -> None:
    jaas = settings.pop("sasl.jaas.config", None)
    mechanism = str(settings.get("sasl.mechanism", settings.get("sasl.mechanisms", "GSSAPI"))).upper()
    protocol = str(settings.get("security.protocol", "PLAINTEXT")).upper()
    if jaas is None:
        return
    if not protocol.startswith("SASL_"):
        raise ConfigError(f"{_OWNER}: {_key('sasl.jaas.config')} is set but {_key('security.protocol')} is "
                          f"{protocol}; use SASL_PLAINTEXT or SASL_SSL")
    if mechanism not in _LOGIN_MODULES:
        raise ConfigError(
            f"{_OWNER}: {_key('sasl.mechanism')}={mechanism} cannot be taken from {_key('sasl.jaas.config')}; "
            f"supported: {', '.join(SASL_MECHANISMS)}. For others set librdkafka's own settings "
            "(kafka.sasl.kerberos.*, kafka.sasl.oauthbearer.*) and leave sasl.jaas.config out"
        )
    match = _JAAS.match(str(jaas))
    if match is None or match["module"] != _LOGIN_MODULES[mechanism]:
        raise ConfigError(
            f"{_OWNER}: {_key('sasl.jaas.config')} must be `{_LOGIN_MODULES[mechanism]} required "
            f'username="..." password="...";` for {mechanism}'
            + ("" if match is None else f", got login module {match['module']}")
        )
    options = {m["key"]: m["quoted"] if m["quoted"] is not None else m["bare"]
               for m in _JAAS_OPTION.finditer(match["options"])}
    for option in ("username", "password"):
        if not options.get(option):
            raise ConfigError(f"{_OWNER}: {_key('sasl.jaas.config')} has no {option}=\"...\"")
    settings["sasl.mechanism"] = mechanism
    settings.setdefault("sasl.username", _unescape(options["username"]))
    settings.setdefault("sasl.password", _unescape(options["password"]))


def _unescape(value: str) -> str:
    return re.sub(r"\\(.)", r"\1", value)


def _require_pem(settings: dict[str, Any], store: str) -> bool:
    """Whether `store` (truststore or keystore) settings are present; refuse any type but PEM."""
    present = [k for k in settings if k.startswith(f"ssl.{store}.")]
    if not present:
        return False
    store_type = str(settings.pop(f"ssl.{store}.type", "JKS")).upper()
    if store_type != "PEM":
        librdkafka = ("kafka.ssl.ca.location (a PEM file of CA certificates)" if store == "truststore" else
                      "kafka.ssl.certificate.location and kafka.ssl.key.location (PEM files)")
        raise ConfigError(
            f"{_OWNER}: {_key(f'ssl.{store}.type')}={store_type} is not supported (the Kafka client here is "
            f"librdkafka, which reads no Java key stores): convert the store to PEM and set "
            f"{_key(f'ssl.{store}.type')}=PEM, or use {librdkafka}"
        )
    if settings.pop(f"ssl.{store}.password", None):
        raise ConfigError(f"{_OWNER}: {_key(f'ssl.{store}.password')} does not apply to a PEM {store}; "
                          + ("leave it out" if store == "truststore" else "use kafka.ssl.key.password"))
    return True


def _translate_truststore(settings: dict[str, Any]) -> None:
    if not _require_pem(settings, "truststore"):
        return
    location = settings.pop("ssl.truststore.location", None)
    certificates = settings.pop("ssl.truststore.certificates", None)
    if (location is None) == (certificates is None):
        raise ConfigError(f"{_OWNER}: a PEM truststore needs exactly one of {_key('ssl.truststore.location')} "
                          f"and {_key('ssl.truststore.certificates')}")
    if location is not None:
        settings["ssl.ca.location"] = str(location)
    else:
        settings["ssl.ca.pem"] = str(certificates)


def _translate_keystore(settings: dict[str, Any]) -> None:
    if not _require_pem(settings, "keystore"):
        return
    location = settings.pop("ssl.keystore.location", None)
    chain = settings.pop("ssl.keystore.certificate.chain", None)
    key = settings.pop("ssl.keystore.key", None)
    if location is not None and (chain is None and key is None):
        # One PEM file holding the private key and the certificate chain: OpenSSL picks each block it needs.
        settings["ssl.certificate.location"] = str(location)
        settings["ssl.key.location"] = str(location)
    elif location is None and chain is not None and key is not None:
        settings["ssl.certificate.pem"] = str(chain)
        settings["ssl.key.pem"] = str(key)
    else:
        raise ConfigError(
            f"{_OWNER}: a PEM keystore needs {_key('ssl.keystore.location')} (key and certificate chain in one "
            f"file), or both {_key('ssl.keystore.certificate.chain')} and {_key('ssl.keystore.key')}"
        )
