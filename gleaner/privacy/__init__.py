"""Privacy at the bottom of the layering: ``<private>`` spans and secrets redacted by one set
of rules for every package (``privacy.private``; the detector is ``privacy.secrets``)."""

from gleaner.privacy.private import REDACTED, redact, redact_private, redact_secrets, strip_private

__all__ = ["REDACTED", "redact", "redact_private", "redact_secrets", "strip_private"]
