"""Triton python-backend models of the served ensemble, one folder per deployable model.

``publish`` copies ``<part>/model.py`` into ``<repository>/_<name>.<part>/<v>/model.py``
together with :mod:`maskops_serving_ops` (this folder's self-contained numpy/Pillow/
pycocotools processing). They run inside Triton's python stub, which provides
``triton_python_backend_utils``; the Triton image installs only the ``triton`` extra, so
they import neither torch nor any maskops module, only the ops file next to them. Heavy
objects (the onnxruntime session, the label map) are built once in ``initialize``.
"""
