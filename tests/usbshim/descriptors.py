"""USB descriptors as the bytes GET_DESCRIPTOR returns, built from a pyusb
backend's descriptor objects, for the device list the server sends the shim
(README.md: "Wire format")."""

from __future__ import annotations

import itertools
import struct

import usb.core


def raw_device(d) -> bytes:
    """The 18-byte device descriptor of ``d`` (a backend's device descriptor object)."""
    return struct.pack("<BBHBBBBHHHBBBB", 18, 1, d.bcdUSB, d.bDeviceClass, d.bDeviceSubClass,
                       d.bDeviceProtocol, d.bMaxPacketSize0, d.idVendor, d.idProduct,
                       d.bcdDevice, d.iManufacturer, d.iProduct, d.iSerialNumber,
                       d.bNumConfigurations)


def raw_configuration(backend, dev, index: int) -> bytes:
    """Configuration ``index`` of ``dev`` as the bytes GET_DESCRIPTOR would return,
    built from the backend's descriptor objects (pyusb's attribute names)."""
    cfg = backend.get_configuration_descriptor(dev, index)
    body = bytes(getattr(cfg, "extra_descriptors", None) or b"")
    for number in range(cfg.bNumInterfaces):
        for alt in itertools.count():
            try:
                intf = backend.get_interface_descriptor(dev, number, alt, index)
            except (IndexError, usb.core.USBError):
                break
            body += struct.pack("<9B", 9, 4, intf.bInterfaceNumber, intf.bAlternateSetting,
                                intf.bNumEndpoints, intf.bInterfaceClass,
                                intf.bInterfaceSubClass, intf.bInterfaceProtocol,
                                intf.iInterface)
            body += bytes(getattr(intf, "extra_descriptors", None) or b"")
            for i in range(intf.bNumEndpoints):
                ep = backend.get_endpoint_descriptor(dev, i, number, alt, index)
                body += struct.pack("<BBBBHB", 7, 5, ep.bEndpointAddress, ep.bmAttributes,
                                    ep.wMaxPacketSize, ep.bInterval)
                body += bytes(getattr(ep, "extra_descriptors", None) or b"")
    power = getattr(cfg, "bMaxPower", getattr(cfg, "MaxPower", 0))
    head = struct.pack("<BBHBBBBB", 9, 2, 9 + len(body), cfg.bNumInterfaces,
                       cfg.bConfigurationValue, cfg.iConfiguration, cfg.bmAttributes, power)
    return head + body
