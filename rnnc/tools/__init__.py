"""rnnc's tools: the ``rnnc`` command (``cli``), ``rnnc demo`` (``demo``) and ``rnnc bench``
(``bench``). Nothing here is imported by ``import rnnc``."""
