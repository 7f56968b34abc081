"""Entry point torch calls at `import torch` (group `torch.backends`).

It must be cheap and must never break `import torch`: it only registers the backend name with a
creator that loads the C++ extension on first use.
"""


def autoload() -> None:
    try:
        from hoccl_backend._registration import register

        register()
    except Exception:  # noqa: BLE001 - a broken install must not break `import torch`
        pass
