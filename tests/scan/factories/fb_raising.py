"""A factory whose own code fails: feedbench must show these frames, not its own."""


def make_loader(path, batch_size):
    return open_index(path, batch_size)


def open_index(path, batch_size):
    raise ValueError(f"no index.json in {path}")
