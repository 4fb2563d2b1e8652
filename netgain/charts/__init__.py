"""SVG charts drawn without a plotting library: shared by the report and the trace inspector."""
