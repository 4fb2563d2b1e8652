"""Dynamic batching: the bounded request queue and the pre → device → post pipeline."""
