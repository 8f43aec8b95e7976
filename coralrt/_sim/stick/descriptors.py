"""USB descriptors of the simulated Coral USB Accelerator, in both modes.

The shapes follow the Edge TPU stack reference §1.1: bootloader mode
1a6e:089a exposes one DFU interface (class 0xFE, subclass 1, protocol 2) and
no endpoints besides EP0; running mode 18d1:9302 exposes interface 0 of
vendor class 0xFF with bulk OUT 0x01/0x02/0x03, bulk IN 0x81/0x82 and
interrupt IN 0x83 (64 bytes).  The running device reports bcdUSB 0x0310 and
bMaxPacketSize0 9 on SuperSpeed (descriptor captured in edgetpuxray's
``connect.py``); the simulated bootloader says 0x0300 on USB 3 and both say
0x0210 on USB 2.  The DFU functional descriptor advertises 256-byte blocks,
the block size every public host implementation uses (reference §1.4).

The objects carry the attribute names pyusb's ``usb.core`` reads, and
``raw_configuration`` gives the bytes a GET_DESCRIPTOR(CONFIGURATION)
control request returns.
"""

from __future__ import annotations

import struct
from types import SimpleNamespace

import usb.util

from coralrt._usb.constants import (
    APP_ID, BOOTLOADER_ID, DFU_BLOCK_SIZE, EP_EVENT, EP_INTERRUPT, EP_OUT, EP_OUTPUT,
)

__all__ = ["SPEEDS", "device_descriptor", "configuration", "raw_configuration",
           "string_descriptor", "raw_device", "DFU_ATTRIBUTES"]

# libusb speed codes, as pyusb names them
SPEEDS = {"usb2": usb.util.SPEED_HIGH, "usb3": usb.util.SPEED_SUPER}
# bitCanDnload | bitCanUpload | bitManifestationTolerant: after the final
# zero-length DNLOAD the device goes back to dfuIDLE, as libedgetpu expects.
DFU_ATTRIBUTES = 0x07
_STRINGS = {
    "bootloader": ("Global Unichip Corp. (simulated)", "DFU bootloader (simulated)"),
    "running": ("Google (simulated)", "Coral USB Accelerator (simulated)"),
}


def device_descriptor(mode: str, usb_speed: str, *, bus: int, address: int,
                      ports: tuple[int, ...]) -> SimpleNamespace:
    vid, pid = BOOTLOADER_ID if mode == "bootloader" else APP_ID
    usb3 = usb_speed == "usb3"
    bcd = (0x0310 if mode == "running" else 0x0300) if usb3 else 0x0210
    return SimpleNamespace(
        bLength=18, bDescriptorType=1, bcdUSB=bcd, bDeviceClass=0, bDeviceSubClass=0,
        bDeviceProtocol=0, bMaxPacketSize0=9 if usb3 else 64, idVendor=vid, idProduct=pid,
        bcdDevice=0x0100, iManufacturer=1, iProduct=2, iSerialNumber=3,
        bNumConfigurations=1, bus=bus, address=address, port_number=ports[-1],
        port_numbers=tuple(ports), speed=SPEEDS[usb_speed])


def _endpoint(address: int, attributes: int, size: int, interval: int = 0) -> SimpleNamespace:
    return SimpleNamespace(bLength=7, bDescriptorType=5, bEndpointAddress=address,
                           bmAttributes=attributes, wMaxPacketSize=size, bInterval=interval,
                           bRefresh=0, bSynchAddress=0, extra_descriptors=[])


def _dfu_functional() -> list[int]:
    # bLength, DFU FUNCTIONAL (0x21), bmAttributes, wDetachTimeOut (ms),
    # wTransferSize, bcdDFUVersion 1.1
    return list(struct.pack("<BBBHHH", 9, 0x21, DFU_ATTRIBUTES, 1000, DFU_BLOCK_SIZE, 0x0110))


def configuration(mode: str, usb_speed: str) -> SimpleNamespace:
    """The configuration with its interface and endpoints (``.interface``, ``.endpoints``)."""
    if mode == "bootloader":
        endpoints = []
        intf_extra = _dfu_functional()
        cls = (0xFE, 0x01, 0x02)
    else:
        bulk = 1024 if usb_speed == "usb3" else 512
        # EP_OUT and the multi-endpoint OUT endpoints 0x02/0x03, then the IN endpoints
        endpoints = [_endpoint(EP_OUT, 2, bulk), _endpoint(0x02, 2, bulk),
                     _endpoint(0x03, 2, bulk), _endpoint(EP_OUTPUT, 2, bulk),
                     _endpoint(EP_EVENT, 2, bulk),
                     _endpoint(EP_INTERRUPT, 3, 64, 4 if usb_speed == "usb3" else 8)]
        intf_extra = []
        cls = (0xFF, 0xFF, 0xFF)
    intf = SimpleNamespace(bLength=9, bDescriptorType=4, bInterfaceNumber=0,
                           bAlternateSetting=0, bNumEndpoints=len(endpoints),
                           bInterfaceClass=cls[0], bInterfaceSubClass=cls[1],
                           bInterfaceProtocol=cls[2], iInterface=0,
                           extra_descriptors=intf_extra)
    total = 9 + 9 + len(intf_extra) + 7 * len(endpoints)
    return SimpleNamespace(bLength=9, bDescriptorType=2, wTotalLength=total, bNumInterfaces=1,
                           bConfigurationValue=1, iConfiguration=0, bmAttributes=0x80,
                           bMaxPower=0x32 if usb_speed == "usb2" else 0x19,
                           extra_descriptors=[], interface=intf, endpoints=endpoints)


def raw_configuration(cfg: SimpleNamespace) -> bytes:
    """The configuration descriptor bytes with interface, class and endpoint descriptors."""
    intf = cfg.interface
    out = struct.pack("<BBHBBBBB", 9, 2, cfg.wTotalLength, cfg.bNumInterfaces,
                      cfg.bConfigurationValue, cfg.iConfiguration, cfg.bmAttributes,
                      cfg.bMaxPower)
    out += struct.pack("<9B", 9, 4, intf.bInterfaceNumber, intf.bAlternateSetting,
                       intf.bNumEndpoints, intf.bInterfaceClass, intf.bInterfaceSubClass,
                       intf.bInterfaceProtocol, intf.iInterface)
    out += bytes(intf.extra_descriptors)
    for ep in cfg.endpoints:
        out += struct.pack("<BBBBHB", 7, 5, ep.bEndpointAddress, ep.bmAttributes,
                           ep.wMaxPacketSize, ep.bInterval)
    return out


def raw_device(desc: SimpleNamespace) -> bytes:
    return struct.pack("<BBHBBBBHHHBBBB", 18, 1, desc.bcdUSB, desc.bDeviceClass,
                       desc.bDeviceSubClass, desc.bDeviceProtocol, desc.bMaxPacketSize0,
                       desc.idVendor, desc.idProduct, desc.bcdDevice, desc.iManufacturer,
                       desc.iProduct, desc.iSerialNumber, desc.bNumConfigurations)


def string_descriptor(mode: str, index: int, serial: str) -> bytes | None:
    """String descriptor ``index`` (0: the language list), or None if there is none."""
    if index == 0:
        return bytes([4, 3, 0x09, 0x04])   # en-US
    texts = (*_STRINGS[mode], serial)
    if not 1 <= index <= len(texts):
        return None
    data = texts[index - 1].encode("utf-16-le")
    return bytes([2 + len(data), 3]) + data
