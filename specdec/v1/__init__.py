"""Generated from protos/specdec/v1 by scripts/gen_protos.py. Do not edit."""
