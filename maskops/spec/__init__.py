"""Experiment specs: TAO ``mask_rcnn`` spec text and its JSON form, parsed and validated.

- :func:`parse_spec_text` / :func:`spec_to_text`: TAO text <-> :class:`ExperimentSpec`
  (lossless: ``parse_spec_text(spec_to_text(s)) == s``).
- :func:`spec_from_json`: the REST API's JSON form, validated alike.
- :func:`load_spec`: a file, text or ``.json``.
- :class:`SpecError`: the one error, ``source:line: field: message``.
"""

from maskops.spec.errors import SpecError
from maskops.spec.loading import load_spec
from maskops.spec.models import AspectRatio, DataConfig, ExperimentSpec, ImageSize, MaskRCNNConfig
from maskops.spec.text import parse_spec_text, spec_to_text
from maskops.spec.validation import spec_from_json

__all__ = [
    "AspectRatio",
    "DataConfig",
    "ExperimentSpec",
    "ImageSize",
    "MaskRCNNConfig",
    "SpecError",
    "load_spec",
    "parse_spec_text",
    "spec_from_json",
    "spec_to_text",
]
