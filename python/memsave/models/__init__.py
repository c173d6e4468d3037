"""The built-in benchmark models (vgg16, unet, resnet50, gpt2 at sizes tiny, cpu and full) with their seeded
synthetic data: what ``python -m memsave bench/estimate --model NAME``, the examples and ``benchmarks/`` run.

=============  ===================================================================================================
``zoo.py``     the models, :data:`SIZES`, :func:`build` (a :class:`BenchCase`: model, inputs, loss) and
               :class:`ShapeCrossEntropy` (cross-entropy against targets shaped from the output)
``hub.py``     Hugging Face transformers, timm and torchvision models at small configs with random weights
``eager.py``   Hugging Face's Llama RMSNorm and MLP in plain torch: what memsave's transformer operators replace
=============  ===================================================================================================

These are test and benchmark subjects, not part of measuring: :mod:`memsave.measurement` never imports them.
"""

from .zoo import GPT, MODELS, SIZES, VGG16, BenchCase, ResNet50, ShapeCrossEntropy, UNet, build

__all__ = ["GPT", "MODELS", "SIZES", "VGG16", "BenchCase", "ResNet50", "ShapeCrossEntropy", "UNet", "build"]
