"""The Java client security settings a broker passes become librdkafka's (issue 10); what librdkafka
cannot do fails at configuration, naming the key and what to use instead."""

from __future__ import annotations

import pytest

from rlmm.client_security import librdkafka_settings
from rlmm.errors import ConfigError

SCRAM_JAAS = ('org.apache.kafka.common.security.scram.ScramLoginModule required username="tier" '
              'password="s3cr\\"et";')


def test_scram_jaas_config_becomes_username_and_password() -> None:
    settings = librdkafka_settings({"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
                                    "sasl.jaas.config": SCRAM_JAAS})
    assert settings == {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
                        "sasl.username": "tier", "sasl.password": 's3cr"et'}


def test_plain_jaas_config_becomes_username_and_password() -> None:
    jaas = "org.apache.kafka.common.security.plain.PlainLoginModule required username=alice password=pw"
    settings = librdkafka_settings({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
                                    "sasl.jaas.config": jaas})
    assert (settings["sasl.username"], settings["sasl.password"]) == ("alice", "pw")


def test_a_login_module_that_does_not_match_the_mechanism_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"kafka\.sasl\.jaas\.config must be .*ScramLoginModule"):
        librdkafka_settings({"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-256",
                             "sasl.jaas.config": "org.apache.kafka.common.security.plain.PlainLoginModule "
                                                 'required username="a" password="b";'})


def test_oauthbearer_from_jaas_is_refused_naming_librdkafkas_settings() -> None:
    with pytest.raises(ConfigError, match=r"kafka\.sasl\.mechanism=OAUTHBEARER .*kafka\.sasl\.oauthbearer"):
        librdkafka_settings({"security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER",
                             "sasl.jaas.config": "x required;"})


def test_a_pem_truststore_file_becomes_the_ca_location() -> None:
    settings = librdkafka_settings({"security.protocol": "SSL", "ssl.truststore.type": "PEM",
                                    "ssl.truststore.location": "/etc/kafka/ca.pem"})
    assert settings == {"security.protocol": "SSL", "ssl.ca.location": "/etc/kafka/ca.pem"}


def test_inline_pem_truststore_and_keystore_become_pem_strings() -> None:
    settings = librdkafka_settings({
        "security.protocol": "SSL", "ssl.truststore.type": "PEM", "ssl.truststore.certificates": "CA",
        "ssl.keystore.type": "PEM", "ssl.keystore.certificate.chain": "CHAIN", "ssl.keystore.key": "KEY",
        "ssl.key.password": "kp",
    })
    assert settings == {"security.protocol": "SSL", "ssl.ca.pem": "CA", "ssl.certificate.pem": "CHAIN",
                        "ssl.key.pem": "KEY", "ssl.key.password": "kp"}


def test_a_pem_keystore_file_serves_as_certificate_and_key() -> None:
    settings = librdkafka_settings({"security.protocol": "SSL", "ssl.keystore.type": "PEM",
                                    "ssl.keystore.location": "/k.pem"})
    assert settings["ssl.certificate.location"] == settings["ssl.key.location"] == "/k.pem"


@pytest.mark.parametrize("store", ["truststore", "keystore"])
def test_a_jks_store_is_refused_naming_the_key_and_the_pem_alternative(store: str) -> None:
    with pytest.raises(ConfigError, match=rf"kafka\.ssl\.{store}\.type=JKS is not supported.*PEM"):
        librdkafka_settings({"security.protocol": "SSL", f"ssl.{store}.location": "/s.jks",
                             f"ssl.{store}.password": "pw"})


def test_a_store_without_a_type_is_taken_as_jks_and_refused() -> None:
    with pytest.raises(ConfigError, match=r"kafka\.ssl\.truststore\.type=JKS"):
        librdkafka_settings({"security.protocol": "SSL", "ssl.truststore.location": "/ts.jks"})


def test_javas_empty_endpoint_identification_turns_host_checking_off() -> None:
    settings = librdkafka_settings({"security.protocol": "SSL", "ssl.endpoint.identification.algorithm": ""})
    assert settings["ssl.endpoint.identification.algorithm"] == "none"


def test_librdkafka_names_pass_through_unchanged() -> None:
    native = {"security.protocol": "SASL_SSL", "sasl.mechanisms": "SCRAM-SHA-256", "sasl.username": "u",
              "sasl.password": "p", "ssl.ca.location": "/ca.pem"}
    assert librdkafka_settings(native) == native
