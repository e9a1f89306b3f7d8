"""Datasets: synthetic demo data, COCO validation and conversion to shards, and loaders.

- :mod:`maskops.data.demo`: ``generate_demo_dataset`` (shapes, exact polygon masks).
- :mod:`maskops.data.coco`: structural reading of COCO JSON (``DatasetError``).
- :mod:`maskops.data.validate`: per-image checks and repairs, and the warning kinds.
- :mod:`maskops.data.convert`: ``convert_dataset`` (``dataset_convert``).
- :mod:`maskops.data.shards` / :mod:`maskops.data.manifest`: the shard format, manifests,
  ``load_label_map(pattern)``.
- :mod:`maskops.data.pipeline`: ``build_train_loader`` / ``build_eval_loader``.
- :mod:`maskops.data.labels`, :mod:`maskops.data.transforms`: label maps, ``resize_and_pad``.

Submodules are imported explicitly: only the pipeline and transforms need torch.
"""
