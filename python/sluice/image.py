"""Image decoding and augmentation as sluice expressions (C++ dataset/image.h).

    from sluice import x, image, io
    ds = image.image_folder("/data/train").with_seed(42).map(
        (image.normalize(image.random_horizontal_flip(image.random_resized_crop(
             image.decode(io.read_file(x[0])), 224, 224)),
             (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
         x[1]),
        num_parallel_calls=sluice.AUTOTUNE)
"""

from ._sluice import image as _image

decode = _image.decode
random_resized_crop = _image.random_resized_crop
resize = _image.resize
center_crop = _image.center_crop
random_horizontal_flip = _image.random_horizontal_flip
normalize = _image.normalize
folder_classes = _image.folder_classes
folder_label = _image.folder_label
image_folder = _image.image_folder

__all__ = [
    "decode", "random_resized_crop", "resize", "center_crop", "random_horizontal_flip",
    "normalize", "folder_classes", "folder_label", "image_folder",
]
