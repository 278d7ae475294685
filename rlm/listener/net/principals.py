"""Who a listener client is, as a Kafka broker would name it: the principal the cluster's ACLs are about.

- A SASL client is ``User:<name>`` (the name it authenticated, PLAIN or SCRAM).
- A client that presented a certificate (mutual TLS) and no SASL is ``User:<mapped subject>``: the certificate's
  subject distinguished name as Java's ``X500Principal.getName()`` writes it (RFC 2253: the most specific RDN
  first, ``CN=reader,OU=ops,O=example,C=US``; attributes without an RFC 2253 keyword as ``<oid>=#<DER hex>``),
  turned into a name by ``history_listener.tls.principal_mapping_rules``, Kafka's ``ssl.principal.mapping.rules``.
- Anyone else is ``User:ANONYMOUS``.

Mapping rules, Kafka's syntax (``SslPrincipalMapper``), tried in order, the first that matches wins:

- ``DEFAULT``: the whole distinguished name;
- ``RULE:pattern/replacement/[L|U]``: when the regular expression ``pattern`` matches the *whole* name, the name
  with every match replaced by ``replacement`` (``$1`` is the first group), then lower- (``L``) or upper-cased
  (``U``). ``\\/`` is a slash inside the pattern or the replacement.

A name no rule matches raises :class:`NoMatchingRuleError` (Kafka fails the connection's authentication). The
patterns are Python regular expressions; the ones written for Java's (groups, classes, anchors, ``.*?``) mean the
same.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ANONYMOUS",
    "Client",
    "MappingRule",
    "NoMatchingRuleError",
    "PrincipalMapper",
    "parse_mapping_rules",
    "peer_host",
    "subject_dn",
    "user",
]

ANONYMOUS = "User:ANONYMOUS"


@dataclass(frozen=True, slots=True)
class Client:
    """Who sent a request: the principal the cluster's ACLs name (``User:alice``) and its address."""

    principal: str
    host: str

# Kafka's SslPrincipalMapper.RULE_PATTERN, one rule per item here (no comma splitting).
_RULE = re.compile(r"RULE:((?:\\.|[^\\/])*)/((?:\\.|[^\\/])*)/([LU]?)")
_JAVA_GROUP = re.compile(r"\\(.)|\$(\d+)|\$\{(\w+)\}")

# The attribute keywords Java's RFC 2253 output uses; any other attribute is written as <oid>=#<hex of its DER>.
_RFC2253_KEYWORDS = {
    "2.5.4.3": "CN", "2.5.4.6": "C", "2.5.4.7": "L", "2.5.4.8": "ST", "2.5.4.10": "O", "2.5.4.11": "OU",
    "2.5.4.9": "STREET", "0.9.2342.19200300.100.1.25": "DC", "0.9.2342.19200300.100.1.1": "UID",
}


class NoMatchingRuleError(ValueError):
    """No ``principal_mapping_rules`` entry matches a certificate's subject."""


def user(name: str) -> str:
    """The principal of an authenticated user name."""
    return f"User:{name}"


def peer_host(peer: Any) -> str:
    """A client's address (its socket's ``peername``'s host), as its :class:`Client` carries it."""
    return str(peer[0]) if isinstance(peer, tuple) else str(peer)


@dataclass(frozen=True, slots=True)
class MappingRule:
    """One ``principal_mapping_rules`` entry (``pattern`` None: DEFAULT)."""

    text: str
    pattern: re.Pattern[str] | None = None
    replacement: str = ""
    case: str = ""

    def apply(self, dn: str) -> str | None:
        if self.pattern is None:
            return dn
        if self.pattern.fullmatch(dn) is None:  # Java's Matcher.matches(): the whole name
            return None
        name = self.pattern.sub(self.replacement, dn)  # Java's replaceAll
        return name.lower() if self.case == "L" else name.upper() if self.case == "U" else name


def _python_replacement(java: str) -> str:
    """Java's replacement syntax (``$1``, ``${name}``, ``\\x`` a literal x) as :func:`re.sub`'s."""
    out: list[str] = []
    pos = 0
    for m in _JAVA_GROUP.finditer(java):
        out.append(java[pos:m.start()].replace("\\", "\\\\"))
        literal, number, named = m.groups()
        if literal is not None:
            out.append(literal.replace("\\", "\\\\"))
        else:
            out.append(f"\\g<{number or named}>")
        pos = m.end()
    out.append(java[pos:].replace("\\", "\\\\"))
    return "".join(out)


def parse_mapping_rules(rules: Sequence[str]) -> tuple[MappingRule, ...]:
    """The rules, checked: raises :class:`ValueError` naming the rule that is not ``DEFAULT`` or
    ``RULE:pattern/replacement/[LU]``, or whose pattern does not compile."""
    parsed = []
    for text in rules:
        stripped = text.strip()
        if stripped == "DEFAULT":
            parsed.append(MappingRule(text))
            continue
        m = _RULE.fullmatch(stripped)
        if m is None:
            raise ValueError(f"principal mapping rule {text!r} is neither DEFAULT nor RULE:pattern/replacement/[LU]")
        pattern, replacement, case = (g.replace("\\/", "/") for g in m.groups())
        try:
            compiled = re.compile(pattern)
        except re.error as err:
            raise ValueError(f"principal mapping rule {text!r}: its pattern does not compile: {err}") from None
        repl = _python_replacement(replacement)
        _check_groups(compiled, repl, text)  # a group the pattern lacks fails here, not on a client's name
        parsed.append(MappingRule(text, compiled, repl, case))
    return tuple(parsed)


def _check_groups(pattern: re.Pattern[str], repl: str, text: str) -> None:
    for ref in re.findall(r"\\g<(\w+)>", repl):
        if ref.isdigit() and int(ref) > pattern.groups or not ref.isdigit() and ref not in pattern.groupindex:
            raise ValueError(f"principal mapping rule {text!r}: the replacement names group {ref}, which the "
                             f"pattern does not have")


class PrincipalMapper:
    """``principal_mapping_rules`` applied to certificate subjects."""

    def __init__(self, rules: Sequence[str] = ("DEFAULT",)) -> None:
        self.rules = parse_mapping_rules(rules)

    def name(self, dn: str) -> str:
        """The user name of subject ``dn``; raises :class:`NoMatchingRuleError`."""
        for rule in self.rules:
            name = rule.apply(dn)
            if name is not None:
                return name
        raise NoMatchingRuleError(f"no principal mapping rule matches the certificate subject {dn!r}")

    def principal(self, der_certificate: bytes) -> str:
        return user(self.name(subject_dn(der_certificate)))


def subject_dn(der_certificate: bytes) -> str:
    """A DER certificate's subject as Java's ``X500Principal.getName()`` (RFC 2253) writes it."""
    from cryptography import x509

    cert = x509.load_der_x509_certificate(der_certificate)
    rdns = []
    for rdn in reversed(list(cert.subject.rdns)):  # RFC 2253: the last RDN of the sequence first
        parts = []
        for attr in rdn:
            keyword = _RFC2253_KEYWORDS.get(attr.oid.dotted_string)
            if keyword is not None:
                parts.append(f"{keyword}={_escape(str(attr.value))}")
            else:
                parts.append(f"{attr.oid.dotted_string}=#{_der_string(attr).hex()}")
        rdns.append("+".join(parts))
    return ",".join(rdns)


def _escape(value: str) -> str:
    """RFC 2253 section 2.4, as Java escapes: ``,+"\\<>;`` anywhere, ``#`` or a space first, a space last."""
    out = "".join("\\" + c if c in ',+"\\<>;' else c for c in value)
    if out.startswith(("#", " ")):
        out = "\\" + out
    if out.endswith(" ") and not out.endswith("\\ "):
        out = out[:-1] + "\\ "
    return out


def _der_string(attr: object) -> bytes:
    """The DER encoding (tag, length, content) of a string attribute value."""
    tag = attr._type.value  # type: ignore[attr-defined]  # cryptography's _ASN1Type: the universal tag number
    value = attr.value  # type: ignore[attr-defined]
    if isinstance(value, bytes):
        content = value
    elif tag == 30:  # BMPString
        content = value.encode("utf-16-be")
    elif tag == 28:  # UniversalString
        content = value.encode("utf-32-be")
    elif tag == 12:  # UTF8String
        content = value.encode("utf-8")
    else:  # PrintableString, IA5String, T61String...: one byte a character
        content = value.encode("latin-1")
    n = len(content)
    length = bytes([n]) if n < 0x80 else bytes([0x80 | ((n.bit_length() + 7) // 8)]) + n.to_bytes(
        (n.bit_length() + 7) // 8, "big")
    return bytes([tag]) + length + content
