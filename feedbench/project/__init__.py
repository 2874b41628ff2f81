"""Projection: from a scan's measured points to the scaling curve, its band and its limits."""
