"""Credentials stay out of every text stored or shown (redaction.py): passwords in URLs and
keyword strings, the secrets looked up, a driver's log lines."""

from __future__ import annotations

import pytest

from airflow_txn_provider.utils import redaction

SECRET = "r3dacted-0nly-S3cret"  # not test_credentials.py's: Airflow's masker keeps what it saw


@pytest.fixture(autouse=True)
def _fresh_registry(monkeypatch):
    monkeypatch.setattr(redaction, "_secrets", set())


class TestRedact:
    @pytest.mark.parametrize(
        "text",
        [
            f"postgresql://ice:{SECRET}@db:5432/cat",
            f"postgresql+psycopg://ice:{SECRET}@db/cat?sslmode=require",
            f"could not open catalog (jdbc:postgresql://u:{SECRET}@h/x): refused",
            f"host=db user=ice password={SECRET} dbname=cat",
            f"host=db password='{SECRET}' dbname=cat",
            f"...?user=ice&password={SECRET}&sslmode=require",
        ],
    )
    def test_passwords_in_urls_and_keyword_strings(self, text):
        out = redaction.redact(text)
        assert SECRET not in out and "***" in out

    def test_a_registered_secret_anywhere_in_a_text(self):
        text = f"the job printed {SECRET} in its error"
        assert redaction.redact(text) == text  # not known yet, not URL-shaped
        redaction.register_secret(SECRET)
        assert redaction.redact(text) == "the job printed *** in its error"

    def test_texts_without_secrets_are_kept(self):
        text = "pipeline=p txid=3 attempt=1: processing failed: ValueError: bad row 'a:b@c'"
        assert redaction.redact(text) == text
        assert redaction.redact_optional(None) is None

    def test_very_short_secrets_are_not_replaced_everywhere(self):
        redaction.register_secret("ab")
        assert redaction.redact("table abc") == "table abc"


def test_a_driver_log_line_is_redacted_before_it_leaves_the_process(caplog):
    import logging

    redaction.register_secret(SECRET)
    logger = logging.getLogger("txn.test.redacting")
    handler = logging.StreamHandler()
    handler.addFilter(redaction.RedactingFilter())
    caplog.handler.addFilter(redaction.RedactingFilter())
    logger.addHandler(handler)
    try:
        logger.warning("catalog %s said %s", f"postgresql://u:{SECRET}@h/db", SECRET)
    finally:
        logger.removeHandler(handler)
    assert caplog.messages == ["catalog postgresql://u:***@h/db said ***"]
