"""What people read: the journal and its plots, the index, compare and series views, and
the progress lines."""
