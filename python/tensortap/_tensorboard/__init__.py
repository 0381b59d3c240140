"""`tensortap tensorboard`: a run's events written by the reader, by
EVENTS.md (export), their TFRecord framing and protobuf messages encoded by
hand (events), the histograms and scalars (values)."""
