"""String `format` grammars.  Each is the body of a rule matching the string
CONTENT (without quotes); every one accepts only characters that need no JSON
escape."""
from __future__ import annotations

FORMATS = {
    "date": (
        '[0-9]{4} "-" ( ("0" [13578] | "1" [02]) "-" ("0" [1-9] | [12] [0-9] | "3" [01])'
        ' | ("0" [469] | "11") "-" ("0" [1-9] | [12] [0-9] | "30")'
        ' | "02" "-" ("0" [1-9] | "1" [0-9] | "2" [0-8]) )'
    ),
    "time": ('([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ("." [0-9]{1,9})?'
             ' ("Z" | [+-] ([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9])'),
    "uuid": ('[0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4}'
             ' "-" [0-9a-fA-F]{12}'),
    "email": ('[a-zA-Z0-9!#$%&\'*+/=?^_`{|}~-]+ ("." [a-zA-Z0-9!#$%&\'*+/=?^_`{|}~-]+)* "@"'
              ' [a-zA-Z0-9] ([a-zA-Z0-9-]{0,61} [a-zA-Z0-9])?'
              ' ("." [a-zA-Z0-9] ([a-zA-Z0-9-]{0,61} [a-zA-Z0-9])?)+'),
    "ipv4": None,  # filled below
    "ipv6": None,
    "uri": None,  # filled below (needs ipv6)
}
FORMATS["date-time"] = "(" + FORMATS["date"] + ') "T" (' + FORMATS["time"] + ")"
_OCTET = '("25" [0-5] | "2" [0-4] [0-9] | "1" [0-9] [0-9] | [1-9] [0-9] | [0-9])'
FORMATS["ipv4"] = " ".join([_OCTET, '"."', _OCTET, '"."', _OCTET, '"."', _OCTET])


def _ipv6() -> str:
    h16 = "[0-9a-fA-F]{1,4}"
    ls32 = '(%s ":" %s | %s)' % (h16, h16, FORMATS["ipv4"])

    def rep(n):  # n times (h16 ":")
        return ('(%s ":"){%d}' % (h16, n)) if n else ""

    def head(k):  # [ *k(h16 ":") h16 ]
        return '(%s ":"){0,%d} %s' % (h16, k, h16) if k else h16

    alts = [rep(6) + " " + ls32, '"::" ' + rep(5) + " " + ls32]
    tails = [rep(4) + " " + ls32, rep(3) + " " + ls32, rep(2) + " " + ls32,
             h16 + ' ":" ' + ls32, ls32, h16, '""']
    for k, tail in enumerate(tails):
        alts.append('(%s)? "::" %s' % (head(k), tail))
    return " | ".join("(" + a.strip() + ")" for a in alts)


FORMATS["ipv6"] = _ipv6()
_PCT = '"%" [0-9a-fA-F] [0-9a-fA-F]'
_PCHAR = "([a-zA-Z0-9._~!$&'()*+,;=:@-] | %s)" % _PCT
_SEGMENTS = '("/" %s*)*' % _PCHAR
# RFC 3986: scheme ":" ("//" authority path-abempty | path-absolute |
# path-rootless | path-empty) ["?" query] ["#" fragment]; hosts are an
# IPv6 literal or a reg-name (IPvFuture is left out).
_AUTHORITY = (
    "(([a-zA-Z0-9._~!$&'()*+,;=:-] | %s)* \"@\")?"
    " (\"[\" (%s) \"]\" | ([a-zA-Z0-9._~!$&'()*+,;=-] | %s)*) (\":\" [0-9]*)?"
) % (_PCT, FORMATS["ipv6"], _PCT)
_QUERY_FRAGMENT = (
    " (\"?\" ([a-zA-Z0-9._~!$&'()*+,;=:@/?-] | %s)*)?"
    " (\"#\" ([a-zA-Z0-9._~!$&'()*+,;=:@/?-] | %s)*)?"
) % (_PCT, _PCT)
FORMATS["uri"] = (
    '[a-zA-Z] [a-zA-Z0-9+.-]* ":"'
    " ( \"//\" %s %s"
    " | \"/\" (%s+ %s)?"
    " | %s+ %s )?"
) % (_AUTHORITY, _SEGMENTS, _PCHAR, _SEGMENTS, _PCHAR, _SEGMENTS) + _QUERY_FRAGMENT
# RFC 3986 URI-reference: a URI or a relative reference, whose first segment
# has no ":" (path-noscheme).
_NC = "([a-zA-Z0-9._~!$&'()*+,;=@-] | %s)" % _PCT
FORMATS["uri-reference"] = (
    "(%s) | (( \"//\" %s %s | \"/\" (%s+ %s)? | %s+ %s )? %s)"
    % (FORMATS["uri"], _AUTHORITY, _SEGMENTS, _PCHAR, _SEGMENTS, _NC, _SEGMENTS, _QUERY_FRAGMENT))
# RFC 1123 host names: dot-separated labels of letters, digits and inner
# hyphens, at most 63 characters; at most 3 labels here (so at most 191
# characters, under the 253 limit), the last starting with a letter and at
# least 2 long.
_LABEL = "[a-zA-Z0-9] ([a-zA-Z0-9-]{0,61} [a-zA-Z0-9])?"
FORMATS["hostname"] = '(%s "."){0,2} [a-zA-Z] [a-zA-Z0-9-]{0,61} [a-zA-Z0-9]' % _LABEL
# RFC 3339 appendix A durations (at most 9 digits per number).
_D = "[0-9]{1,9}"
_DTIME = ('"T" (%s "H" (%s "M" (%s "S")?)? | %s "M" (%s "S")? | %s "S")'
          % (_D, _D, _D, _D, _D, _D))
FORMATS["duration"] = (
    '"P" ( (%s "Y" (%s "M" (%s "D")?)? | %s "M" (%s "D")? | %s "D") (%s)? | %s | %s "W" )'
    % (_D, _D, _D, _D, _D, _D, _DTIME, _DTIME, _D))
# (shortest, longest) content length in characters; (1, None) when absent.
FORMAT_LENGTHS = {"date": (10, 10), "uuid": (36, 36), "time": (9, None),
                  "date-time": (20, None), "ipv4": (7, 15), "ipv6": (2, 45),
                  "hostname": (2, 191), "duration": (3, None), "uri-reference": (0, None),
                  "uri": (2, None), "email": (5, None)}
