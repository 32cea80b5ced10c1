"""Canal-JSON's ``mysqlType`` and ``sqlType`` maps matched against a known shape without building them.

Why: the columnar lane (:meth:`applier.codecs.canal_json.CanalJSONDecoder.decode_arrow`) needs, per row message,
the shape its maps describe. Decoding both maps into dicts and comparing them with the shape's was about a third of
the lane's parse (two dicts of one entry per column, every message). The lane now reads them as raw JSON
(:class:`msgspec.Raw`, a view of the message's bytes) and a :class:`MapMatch` answers "is this the shape's map"
in two steps:

* the raw text is one the shape already matched: equal bytes parse to an equal map;
* otherwise the text is parsed against a struct made for the shape's map: every key a required field
  (``forbid_unknown_fields``), every value a ``Literal`` of the shape's value. It accepts exactly the texts that
  parse to a map equal to the shape's, key order aside, and builds no dict. TiCDC writes ``mysqlType`` from a Go
  map, whose order changes from message to message (``../shared/vectors/ticdc-real/canal-json``: 561 orders in
  561 messages of a 34-column table), so on a real changefeed this is the common step.

Where the struct is stricter than a dict comparison (a duplicate key whose first value differs from the shape's:
the dict keeps the last), it only says "no": the caller then parses the map itself and finds the shape as
before. Integer literals refuse floats and booleans, as the lane's own types do, so a ``4.0`` never matches a
shape made with ``4``.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

# Raw texts remembered per map: enough for every rotation of a narrow table's Go map, few enough to scan.
KNOWN_TEXTS = 16

_NO_STRUCT = object()


class MapMatch:
    """One shape's map: the raw texts known to parse to it, and the struct decoder that recognises any other."""

    __slots__ = ("mapping", "texts", "_decoder")

    def __init__(self, mapping: dict[str, Any], text: msgspec.Raw | None) -> None:
        self.mapping = mapping
        self.texts: list[msgspec.Raw] = [] if text is None else [text.copy()]
        self._decoder: Any = None  # built on first need; _NO_STRUCT when the map has no struct form

    def __call__(self, text: msgspec.Raw) -> bool:
        """Whether ``text`` (a raw JSON value) parses to this map."""
        return text in self.texts or self.parses(text)

    def parses(self, text: msgspec.Raw) -> bool:
        """Whether ``text`` parses to this map, by the struct (remembered when it does)."""
        dec = self._decoder
        if dec is None:
            dec = self._decoder = _struct_decoder(self.mapping)
        if dec is _NO_STRUCT:
            return False
        try:
            dec.decode(text)
        except (msgspec.ValidationError, msgspec.DecodeError):
            return False
        if len(self.texts) < KNOWN_TEXTS:
            self.texts.append(text.copy())
        return True


def _struct_decoder(mapping: dict[str, Any]) -> Any:
    """A decoder that accepts a JSON object with exactly ``mapping``'s keys, each with exactly its value (str,
    int or null), in any order."""
    fields: list[tuple[str, Any]] = []
    rename: dict[str, str] = {}
    for i, (key, value) in enumerate(mapping.items()):
        if value is None:
            kind: Any = None
        elif type(value) is str or type(value) is int:
            kind = Literal[value]  # type: ignore[valid-type]
        else:
            return _NO_STRUCT
        fields.append((f"f{i}", kind))
        rename[f"f{i}"] = key
    try:
        struct = msgspec.defstruct("ShapeMap", fields, rename=rename, forbid_unknown_fields=True)
        return msgspec.json.Decoder(struct)
    except Exception:  # noqa: BLE001 - pragma: no cover - a map msgspec cannot describe: matched by text only
        return _NO_STRUCT
