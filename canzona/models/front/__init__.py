"""The models' front: ``canzona models`` (``cli``)."""
