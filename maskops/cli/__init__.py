"""The ``maskops`` command line: TAO ``mask_rcnn`` commands over the maskops engine."""
