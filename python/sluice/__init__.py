"""sluice: ML input pipelines, run locally or on a sluice data service.

    import sluice
    from sluice import x

    ds = sluice.Dataset.range(5).map(x * x).distribute(
        processing_mode="parallel_epochs", service="grpc://host:5050").map(x + 1)
    for element in ds:      # a numpy array, or a tuple of them
        ...

See docs/python.md. The compiled part is sluice._sluice; sluice.torch adapts
a dataset to torch.utils.data (it imports torch, so it is not imported here).
"""

from ._sluice import (
    AUTOTUNE,
    INFINITE_CARDINALITY,
    SHARD_HINT,
    UNKNOWN_CARDINALITY,
    Dataset,
    DispatchServer,
    Expr,
    Function,
    Iterator,
    NotFoundError,
    Tensor,
    TensorSpec,
    TlsConfig,
    WorkerServer,
    abs,
    configure_thread_pool,
    constant,
    data_service_stats,
    load_plugin,
    max,
    merge_checkpoints,
    min,
    register_dataset,
    set_log_level,
    to_dlpack,
    transport_stats,
    udf,
    x,
)
from . import image, io

# min, max and abs are left out of `from sluice import *`: they would
# shadow the builtins.
__all__ = [
    "AUTOTUNE", "INFINITE_CARDINALITY", "SHARD_HINT", "UNKNOWN_CARDINALITY",
    "Dataset", "DispatchServer", "Expr", "Function", "Iterator", "NotFoundError",
    "Tensor", "TensorSpec", "TlsConfig", "WorkerServer", "configure_thread_pool",
    "constant", "data_service_stats", "image", "io", "load_plugin", "merge_checkpoints",
    "register_dataset",
    "set_log_level", "to_dlpack", "transport_stats", "udf", "x",
]
