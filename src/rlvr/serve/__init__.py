"""`rlvr serve`: the Tinker API over HTTP, on the trainer ranks, engine and weight sync a run uses.

protocol.py  the SDK's protobuf bodies (tinker.proto), read and written
model.py     one served model: LoRA trainer ranks + engine + sync probe; checks each request first
app.py       routes, sessions, sampling sessions, futures (retrieve_future), seq_id order
"""
