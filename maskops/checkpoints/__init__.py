"""maskops checkpoints: the file format and everything that finds, writes or reads one.

- :mod:`~maskops.checkpoints.model_file`: the maskops checkpoint file (``save_checkpoint``,
  ``read_checkpoint``, ``load_model``, ``CheckpointError``);
- :mod:`~maskops.checkpoints.pretrained`: starting weights from another file (torchvision,
  ImageNet, TAO ``.hdf5``) into a model (``load_weights_into``);
- :mod:`~maskops.checkpoints.run_directory`: a training results directory's checkpoints and
  the model file ``-m`` names (``resolve_model_path``);
- :mod:`~maskops.checkpoints.rng_state`: random-number-generator state as tensors;
- :mod:`~maskops.checkpoints.rank_state`: the random state of the other ranks of a
  multi-rank run.

The trainer's save / keep-K / resume policy (``Checkpointer``, which fails with the
engine's ``TrainingError``) is the engine's: :mod:`maskops.training.checkpointer`. This
package imports nothing of the engine's training loop, so that evaluation, inference,
export and prune read checkpoints without it (and no import cycle runs through it).

Importing the package imports none of them (they need torch; the names are imported from
the module that holds them).
"""
